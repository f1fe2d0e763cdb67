"""GPU correctness of the conversion kernels (``pytest -m gpu tests/kernels``; skipped without CUDA).

Compiled Triton on CUDA against the quantkit.formats reference, bit for bit (NaN matches NaN):
the reference runs on the same GPU, and for moderate sizes on the CPU as well, because
converted bytes must not depend on the device.  Shapes are the awkward ones of the served
models: M = 1, K not a multiple of 128 (GPT-OSS 2880), partial 128-tiles (DeepSeek's 576-row
kv_a_proj_with_mqa), stacked experts [E, N, K], stochastic indices past 2**32; and every launch
configuration the benchmark sweeps gives the same bytes as the default.
"""

from __future__ import annotations

import pytest
import torch

from quantkit.formats import fp8_block, mxfp4, mxfp8
from quantkit.formats.rounding import Rounding
from quantkit.kernels import dispatch
from quantkit.kernels.quant import fp8_block_quant, group_quant, mxfp4_decode

from .kernel_cases import assert_same, scale_one_rows, special_groups, wide_randn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")
RULES = ("floor", "rceil")
ROUNDINGS = (Rounding(), Rounding("stochastic", seed=11, name="model.layers.3.mlp.experts.gate_up_proj", offset=2**32 - 12345))
CONVERSION_OPS = ("mxfp4_decode", "fp8_block_quantize_weight", "mxfp8_quantize", "act_quant_fp8_block", "act_quant_mxfp8")


def triton(op: str, *args, **kw):
    return dispatch.call(op, *args, backend="triton", **kw)


def check_pair(ref, out, what: str, x: torch.Tensor | None = None) -> None:
    assert_same(ref[1], out[1], f"{what} scales")
    assert_same(ref[0], out[0], f"{what} elements", x)


def gen() -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(0)


def randn(shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return wide_randn(shape, torch.Generator().manual_seed(sum(shape))).to(dtype).to(CUDA)


@pytest.mark.parametrize("op", CONVERSION_OPS)
def test_auto_runs_triton_on_cuda(op):
    assert dispatch.which(op, CUDA) == "triton"


# ---- MXFP4 decode ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_mxfp4_decode_gpt_oss_experts(dtype):
    g = gen()
    blocks = torch.randint(0, 256, (4, 5760, 90, 16), dtype=torch.uint8, device=CUDA, generator=g)  # 4 experts of gate_up
    scales = torch.randint(0, 256, (4, 5760, 90), dtype=torch.uint8, device=CUDA, generator=g)  # every byte, NaN included
    out = dispatch.call("mxfp4_decode", blocks, scales, dtype)
    assert_same(mxfp4.decode(blocks, scales, dtype), out, f"mxfp4 decode [4, 5760, 90, 16] {dtype}")


def test_mxfp4_decode_small_and_device_independent():
    blocks = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(1, 16, 16).repeat(256, 1, 1)
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 16)
    for dtype in (torch.bfloat16, torch.float32):
        out = triton("mxfp4_decode", blocks.to(CUDA), scales.to(CUDA), dtype)
        assert_same(mxfp4.decode(blocks, scales, dtype), out, f"mxfp4 decode vs CPU reference {dtype}")
    one = triton("mxfp4_decode", blocks[:1, :1].to(CUDA), scales[:1, :1].to(CUDA), torch.bfloat16)  # a single MX block
    assert_same(mxfp4.decode(blocks[:1, :1], scales[:1, :1], torch.bfloat16), one, "mxfp4 decode, one block")


# ---- FP8 128x128 block weights ---------------------------------------------------------------

WEIGHT_SHAPES = [(1, 1), (1, 7168), (576, 7168), (3, 129, 257), (2, 2880, 2880), (2, 5760, 2880)]


@pytest.mark.parametrize("shape", WEIGHT_SHAPES)
@pytest.mark.parametrize("scale_fmt", fp8_block.SCALE_FMTS)
def test_fp8_block_weight(shape, scale_fmt):
    w = randn(shape)
    for rule in RULES:
        for r in ROUNDINGS:
            ref = fp8_block.quantize_weight(w, scale_fmt, rule, r)
            out = triton("fp8_block_quantize_weight", w, scale_fmt, rule, r)
            check_pair(ref, out, f"fp8-block {shape} {scale_fmt}/{rule}/{r.mode}")


def test_fp8_block_weight_float32_input_and_cpu_reference():
    w = randn((3, 300, 200), torch.float32)
    for r in ROUNDINGS:
        ref = fp8_block.quantize_weight(w.cpu(), "float", "rceil", r)
        check_pair(ref, triton("fp8_block_quantize_weight", w, "float", "rceil", r), f"fp8-block vs CPU reference {r.mode}")


# ---- MXFP8 -----------------------------------------------------------------------------------

MX_SHAPES = [(1, 32), (1, 2880), (3, 7, 96), (4, 2880, 2880), (8192, 7168)]


@pytest.mark.parametrize("shape", MX_SHAPES)
@pytest.mark.parametrize("op", ["mxfp8_quantize", "act_quant_mxfp8"])
def test_mxfp8(shape, op):
    x = randn(shape)
    for rule in RULES:
        for r in ROUNDINGS:
            check_pair(mxfp8.quantize(x, rule, r), triton(op, x, rule, r), f"{op} {shape} {rule}/{r.mode}")


def test_mxfp8_cpu_reference():
    x = randn((5, 64, 2880))
    for r in ROUNDINGS:
        check_pair(mxfp8.quantize(x.cpu(), "rceil", r), triton("mxfp8_quantize", x, "rceil", r), f"mxfp8 vs CPU reference {r.mode}")


# ---- per-128 activations ---------------------------------------------------------------------

ACT_SHAPES = [(1, 7168), (1, 200), (37, 2880), (2, 3, 200), (4096, 7168)]


@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("scale_fmt", fp8_block.SCALE_FMTS)
def test_act_quant_fp8_block(shape, scale_fmt):
    x = randn(shape)
    for rule in RULES:
        ref = fp8_block.quantize_act(x, scale_fmt, rule)
        check_pair(ref, triton("act_quant_fp8_block", x, scale_fmt, rule), f"act_quant {shape} {scale_fmt}/{rule}")
    cpu = fp8_block.quantize_act(x.cpu(), scale_fmt, "rceil")
    check_pair(cpu, triton("act_quant_fp8_block", x, scale_fmt, "rceil"), f"act_quant {shape} vs CPU reference")


# ---- edge values, specials, launch configurations ---------------------------------------------


@pytest.mark.parametrize("hw_cast", [True, False], ids=["cast", "assembled"])
def test_edges_and_specials_on_cuda(hw_cast):
    """Both E4M3 paths (the sm_90 hardware cast and the assembled byte) on every tie and special."""
    if hw_cast and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the hardware E4M3 cast is used on sm_90+ only")
    edges, specials = scale_one_rows(32), torch.cat([special_groups(32).reshape(-1, 128)] * 2)
    tiles = special_groups(32).repeat_interleave(32, dim=0)[:500]
    for rule in RULES:
        for r in ROUNDINGS:
            for x in (edges, specials):
                out = group_quant.mxfp8_quantize(x.to(CUDA), rule, r, hw_cast=hw_cast)
                check_pair(mxfp8.quantize(x, rule, r), out, f"mxfp8 specials {rule}/{r.mode}", x)
            for sf in fp8_block.SCALE_FMTS:
                for x in (edges, tiles):
                    out = fp8_block_quant.quantize_weight(x.to(CUDA), sf, rule, r, 32, hw_cast=hw_cast)
                    check_pair(fp8_block.quantize_weight(x, sf, rule, r, block=32), out, f"fp8-block specials {sf}/{rule}/{r.mode}", x)
        for sf in fp8_block.SCALE_FMTS:
            for x in (edges, specials):
                out = group_quant.act_quant_fp8_block(x.to(CUDA), sf, rule, hw_cast=hw_cast)
                check_pair(fp8_block.quantize_act(x, sf, rule), out, f"act specials {sf}/{rule}", x)


def test_every_benchmarked_launch_configuration_gives_the_same_bytes():
    blocks = torch.randint(0, 256, (3, 100, 9, 16), dtype=torch.uint8, device=CUDA, generator=gen())
    scales = torch.randint(100, 140, (3, 100, 9), dtype=torch.uint8, device=CUDA, generator=gen())
    ref = mxfp4.decode(blocks, scales, torch.bfloat16)
    for cfg in mxfp4_decode.TUNING:
        assert_same(ref, mxfp4_decode.mxfp4_decode(blocks, scales, torch.bfloat16, **cfg), f"mxfp4 decode {cfg}")
    w, r = randn((2, 300, 2880)), ROUNDINGS[1]
    ref = fp8_block.quantize_weight(w, "float", "rceil", r)
    for cfg in fp8_block_quant.TUNING:
        check_pair(ref, fp8_block_quant.quantize_weight(w, "float", "rceil", r, **cfg), f"fp8-block {cfg}")
    ref = mxfp8.quantize(w, "rceil", r)
    for cfg in group_quant.MX_TUNING:
        check_pair(ref, group_quant.mxfp8_quantize(w, "rceil", r, **cfg), f"mxfp8 {cfg}")
    ref = fp8_block.quantize_act(w, "ue8m0", "rceil")
    for cfg in group_quant.ACT_TUNING:
        check_pair(ref, group_quant.act_quant_fp8_block(w, "ue8m0", "rceil", **cfg), f"act_quant {cfg}")


def test_chunked_stochastic_matches_whole_tensor():
    """Quantizing row chunks with their flat offsets reproduces the whole tensor's bytes."""
    x, r = randn((6, 256, 2880)), ROUNDINGS[1]
    whole = triton("mxfp8_quantize", x, "rceil", r)[0]
    n = x[0].numel()
    for e in range(6):
        assert_same(whole[e], triton("mxfp8_quantize", x[e].contiguous(), "rceil", r.at(e * n))[0], f"mxfp8 chunk {e}")
    whole = triton("fp8_block_quantize_weight", x, "float", "rceil", r)[0]
    for e in range(6):
        assert_same(whole[e], triton("fp8_block_quantize_weight", x[e].contiguous(), "float", "rceil", r.at(e * n))[0], f"fp8 chunk {e}")


def test_launcher_rejects_non_contiguous_input():
    x = randn((64, 256)).t()
    with pytest.raises(AssertionError, match="contiguous"):
        triton("mxfp8_quantize", x)
