"""Triton kernels against the quantkit.formats reference, bit for bit, on tiny awkward shapes.

They run compiled on CUDA when a device is present, else in Triton's CPU interpreter
(conftest.py sets TRITON_INTERPRET=1).  The interpreter's own float8 cast is not exact -- it
rounds ties away from zero, drops the carry of a mantissa overflow into an odd exponent field
(1.9375 -> 1.0 where RNE gives 2.0, likewise -1.9375) and truncates results below 2**-6, with
either sign -- and its float32 -> bfloat16 cast mishandles float32 subnormals.  The kernels use
neither there (E4M3 and bfloat16 bytes are assembled from exact integer/float32 arithmetic, see
quantkit/kernels/triton_numerics.py; only compiled sm_90+ runs use the hardware E4M3 cast), so
the interpreter runs are compared bit for bit too, including every E4M3 tie and power-of-two
boundary (``scale_one_rows``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from quantkit.formats import fp8_block, mxfp4, mxfp8
from quantkit.formats.rounding import Rounding
from quantkit.kernels import dispatch, triton_numerics
from quantkit.kernels.quant import fp8_block_quant, fused_act_quant, group_quant, mxfp4_decode

from .kernel_cases import assert_same, scale_one_rows, special_groups, wide_randn

# the interpreter computes in numpy, which warns where the reference overflows to inf or makes NaN too
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

RULES = ("floor", "rceil")
ROUNDINGS = (Rounding(), Rounding("stochastic", seed=7, name="layers.0.w", offset=3))
FAR = Rounding("stochastic", seed=1, name="e", offset=2**32 - 600)  # flat indices cross 2**32 mid-tensor


def triton(op: str, *args, **kw):
    return dispatch.call(op, *args, backend="triton", **kw)


def check_pair(ref: tuple[torch.Tensor, ...], out: tuple[torch.Tensor, ...], what: str, x: torch.Tensor) -> None:
    assert_same(ref[1], out[1], f"{what} scales")
    assert_same(ref[0], out[0], f"{what} elements", x)


# ---- MXFP4 decode ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mxfp4_decode_every_byte_and_scale(triton_device, dtype):
    blocks = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(1, 16, 16).repeat(256, 1, 1)  # [out=256, G=16, 16]
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 16)  # row r: scale byte r
    ref = mxfp4.decode(blocks, scales, dtype)
    out = triton("mxfp4_decode", blocks.to(triton_device), scales.to(triton_device), dtype)
    assert_same(ref, out, f"mxfp4 decode {dtype}")


def test_mxfp4_decode_stacked_experts(triton_device, gen):
    blocks = torch.randint(0, 256, (3, 5, 2, 16), dtype=torch.uint8, generator=gen)  # [E, out, G, 16]
    scales = torch.randint(110, 135, (3, 5, 2), dtype=torch.uint8, generator=gen)
    out = triton("mxfp4_decode", blocks.to(triton_device), scales.to(triton_device), torch.bfloat16)
    assert out.shape == (3, 5, 64)
    assert_same(mxfp4.decode(blocks, scales, torch.bfloat16), out, "mxfp4 decode [E, out, G, 16]")


def test_mxfp4_decode_rejects_mismatched_scales(triton_device):
    blocks = torch.zeros(4, 2, 16, dtype=torch.uint8, device=triton_device)
    with pytest.raises(ValueError, match="do not match"):
        triton("mxfp4_decode", blocks, torch.zeros(4, 3, dtype=torch.uint8, device=triton_device))


# ---- FP8 128x128 block weights ---------------------------------------------------------------


@pytest.mark.parametrize("scale_fmt", fp8_block.SCALE_FMTS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("rounding", ROUNDINGS, ids=lambda r: r.mode)
@pytest.mark.parametrize("shape", [(1, 1), (130, 200), (2, 3, 129, 70)])
def test_fp8_block_weight(triton_device, gen, scale_fmt, rule, rounding, shape):
    w = wide_randn(shape, gen).to(torch.bfloat16)
    ref = fp8_block.quantize_weight(w, scale_fmt, rule, rounding)
    out = triton("fp8_block_quantize_weight", w.to(triton_device), scale_fmt, rule, rounding)
    check_pair(ref, out, f"fp8-block {shape} {scale_fmt}/{rule}/{rounding.mode}", w)


@pytest.mark.parametrize("scale_fmt", fp8_block.SCALE_FMTS)
@pytest.mark.parametrize("rounding", (ROUNDINGS[0], FAR), ids=lambda r: r.mode)
def test_fp8_block_weight_edges_and_specials(triton_device, scale_fmt, rounding):
    """32x32 tiles (the kernel's smallest) holding every E4M3 tie and every special scale case."""
    edges = scale_one_rows(32)  # float32 [R, 128]: every 32x32 tile has amax 448
    specials = special_groups(32).repeat_interleave(32, dim=0)[:500]  # [500, 32]: one case per tile, last partial
    for x in (edges, specials):
        for rule in RULES:
            ref = fp8_block.quantize_weight(x, scale_fmt, rule, rounding, block=32)
            out = triton("fp8_block_quantize_weight", x.to(triton_device), scale_fmt, rule, rounding, 32)
            check_pair(ref, out, f"fp8-block {tuple(x.shape)} {scale_fmt}/{rule}/{rounding.mode}", x)


def test_fp8_block_weight_chunks_by_expert(triton_device, gen):
    """Quantizing experts one by one with their flat offsets gives the whole tensor's bytes."""
    w = wide_randn((3, 40, 130), gen)
    r = Rounding("stochastic", seed=5, name="experts.w")
    whole = triton("fp8_block_quantize_weight", w.to(triton_device), "float", "rceil", r)[0]
    for e in range(3):
        part = triton("fp8_block_quantize_weight", w[e].contiguous().to(triton_device), "float", "rceil", r.at(e * w[e].numel()))[0]
        assert_same(whole[e], part, f"expert {e} quantized alone")


# ---- MXFP8 (weights and 1x32 activations) ----------------------------------------------------


@pytest.mark.parametrize("op", ["mxfp8_quantize", "act_quant_mxfp8"])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("rounding", ROUNDINGS, ids=lambda r: r.mode)
@pytest.mark.parametrize("shape", [(1, 32), (3, 5, 96), (7, 2880)])
def test_mxfp8(triton_device, gen, op, rule, rounding, shape):
    x = wide_randn(shape, gen).to(torch.bfloat16)
    ref = mxfp8.quantize(x, rule, rounding)
    out = triton(op, x.to(triton_device), rule, rounding)
    check_pair(ref, out, f"{op} {shape} {rule}/{rounding.mode}", x)


@pytest.mark.parametrize("rounding", (ROUNDINGS[0], FAR), ids=lambda r: r.mode)
def test_mxfp8_edges_and_specials(triton_device, rounding):
    x = torch.cat([scale_one_rows(32), special_groups(32).reshape(-1, 128)])  # float32 [R, 128]
    for rule in RULES:
        ref = mxfp8.quantize(x, rule, rounding)
        out = triton("mxfp8_quantize", x.to(triton_device), rule, rounding)
        check_pair(ref, out, f"mxfp8 specials {rule}/{rounding.mode}", x)


def test_hardware_e4m3_cast_only_where_exact(triton_device):
    x = torch.linspace(-500, 500, 64, device=triton_device).reshape(2, 32)
    if triton_device.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0):
        assert_same(mxfp8.quantize(x.cpu())[0], group_quant.mxfp8_quantize(x, hw_cast=True)[0], "mxfp8 with the hardware cast")
    else:
        with pytest.raises(ValueError, match="not exact RNE"):
            group_quant.mxfp8_quantize(x, hw_cast=True)


@pytest.mark.parametrize(
    "offset,n,crosses",
    [(0, 0, False), (0, 1, False), (0, 2**32, False), (0, 2**32 + 1, True), (2**32 - 600, 600, False), (2**32 - 600, 601, True),
     (2**32, 2**32, False), (5 * 2**32 - 1, 1, False), (5 * 2**32 - 1, 2, True), (7, 3 * 2**32, True)],
)  # fmt: skip
def test_wraps_says_when_a_low_word_wraps(offset, n, crosses):
    """The kernels drop the per-element high-word select (WRAP=False) only where no flat index
    offset .. offset + n - 1 crosses a multiple of 2**32 (the cases worked out by hand)."""
    assert triton_numerics.wraps(offset, n) == crosses


def test_mxfp8_rejects_partial_block(triton_device):
    with pytest.raises(ValueError, match="multiple of 32"):
        triton("mxfp8_quantize", torch.zeros(2, 48, device=triton_device))


# ---- per-128 activations (DeepSeek act_quant) ------------------------------------------------


@pytest.mark.parametrize("scale_fmt", fp8_block.SCALE_FMTS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", [(1, 128), (1, 200), (2, 3, 7168), (5, 2880)])
def test_act_quant_fp8_block(triton_device, gen, scale_fmt, rule, shape):
    x = wide_randn(shape, gen).to(torch.bfloat16)
    ref = fp8_block.quantize_act(x, scale_fmt, rule)
    out = triton("act_quant_fp8_block", x.to(triton_device), scale_fmt, rule)
    check_pair(ref, out, f"act_quant {shape} {scale_fmt}/{rule}", x)


@pytest.mark.parametrize("group", [128, 64])
def test_act_quant_edges_and_specials(triton_device, group):
    x = torch.cat([scale_one_rows(32), special_groups(32).reshape(-1, 128)])  # float32 [R, 128]
    for scale_fmt in fp8_block.SCALE_FMTS:
        for rule in RULES:
            ref = fp8_block.quantize_act(x, scale_fmt, rule, group)
            out = triton("act_quant_fp8_block", x.to(triton_device), scale_fmt, rule, group)
            check_pair(ref, out, f"act_quant specials g{group} {scale_fmt}/{rule}", x)


@pytest.mark.parametrize("fmt", ["fp8-block", "mxfp8"])
def test_quantizers_do_not_read_rows_past_live_rows(triton_device, gen, fmt):
    """``live_rows`` (an MoE intermediate's num_padded, on the device): the rows at or past it, here NaN and Inf as an
    unwritten buffer may hold, are not read (warnings are errors: the CPU interpreter's numpy warned of their NaN
    arithmetic) and quantize as zero rows; the rows before it are the reference's, bit for bit."""
    x = wide_randn((13, 96), gen).to(torch.bfloat16)  # 13 rows: the live bound falls inside a program's row tile
    x[9:] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e38]).to(torch.bfloat16)[:, None]
    want = x.clone()
    want[9:] = 0
    live = torch.tensor([9], dtype=torch.int32, device=triton_device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if fmt == "fp8-block":
            out = group_quant.act_quant_fp8_block(x.to(triton_device), live_rows=live)
        else:
            out = group_quant.mxfp8_quantize(x.to(triton_device), live_rows=live)
    ref = fp8_block.quantize_act(want) if fmt == "fp8-block" else mxfp8.quantize(want)
    check_pair(ref, out, f"{fmt} with live_rows 9 of 13", want)
    with pytest.raises(AssertionError, match="live_rows: int32"):
        group_quant.act_quant_fp8_block(x.to(triton_device), live_rows=live.long())


# ---- launch tables ---------------------------------------------------------------------------


def test_every_launch_table_row_gives_the_reference_bytes(triton_device, gen):
    """Each row of the format kernels' launch tables is a valid launch of its kernel, with the reference's bytes."""
    blocks = torch.randint(0, 256, (2, 5, 3, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(110, 140, (2, 5, 3), dtype=torch.uint8, generator=gen)
    ref, on = mxfp4.decode(blocks, scales, torch.bfloat16), (blocks.to(triton_device), scales.to(triton_device))
    for cfg in mxfp4_decode.TUNING:
        assert_same(ref, mxfp4_decode.mxfp4_decode(*on, torch.bfloat16, **cfg), f"mxfp4 {cfg}")
    w = wide_randn((130, 200), gen).to(torch.bfloat16)
    for rounding, table in ((ROUNDINGS[0], fp8_block_quant.TUNING), (ROUNDINGS[1], fp8_block_quant.SR_TUNING)):
        ref = fp8_block.quantize_weight(w, "float", "rceil", rounding)
        for cfg in table:
            check_pair(ref, fp8_block_quant.quantize_weight(w.to(triton_device), "float", "rceil", rounding, **cfg), f"fp8-block {cfg}", w)
    x = wide_randn((5, 288), gen).to(torch.bfloat16)
    ref = mxfp8.quantize(x, "rceil", ROUNDINGS[1])
    for cfg in group_quant.MX_TUNING:
        check_pair(ref, group_quant.mxfp8_quantize(x.to(triton_device), "rceil", ROUNDINGS[1], **cfg), f"mxfp8 {cfg}", x)
    ref = fp8_block.quantize_act(x, "ue8m0", "rceil")
    for cfg in group_quant.ACT_TUNING:
        check_pair(ref, group_quant.act_quant_fp8_block(x.to(triton_device), "ue8m0", "rceil", **cfg), f"act_quant {cfg}", x)


def test_launch_table_row_0_is_the_launchers_default():
    """Row 0 of a table is what a call without launch arguments runs (fp8-block weights read theirs from the table)."""
    import inspect

    def defaults(fn) -> dict:
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}

    cases = [(mxfp4_decode.mxfp4_decode, mxfp4_decode.TUNING), (group_quant.mxfp8_quantize, group_quant.MX_TUNING),
             (group_quant.act_quant_fp8_block, group_quant.ACT_TUNING), (fused_act_quant.rmsnorm_act_quant, fused_act_quant.NORM_TUNING),
             (fused_act_quant.silu_mul_act_quant, fused_act_quant.ACT_TUNING), (fused_act_quant.swiglu_act_quant, fused_act_quant.ACT_TUNING)]  # fmt: skip
    for fn, table in cases:
        d = defaults(fn)
        assert {k: d[k] for k in table[0]} == table[0], f"{fn.__name__}: defaults {d} differ from row 0 {table[0]}"


def test_host_cdiv_and_next_pow2_match_triton():
    import triton

    from quantkit.kernels.triton_numerics import cdiv, next_pow2

    assert all(next_pow2(n) == triton.next_power_of_2(n) for n in range(0, 5000))
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 700, 7) for b in (1, 3, 16, 128))


def test_lean_e8m0_decode_gives_every_byte_its_value(triton_device):
    """The three-operation E8M0 decode of the block-diagonal GEMM steps: 2**(b - 127) for all 256 bytes, byte 0 the
    float32 subnormal 2**-127 and 255 NaN, as formats.e8m0.decode and the five-operation kernel decode give them."""
    import triton
    import triton.language as tl

    from quantkit.formats import e8m0

    @triton.jit
    def _decode(b_ptr, lean_ptr, full_ptr):
        b = tl.load(b_ptr + tl.arange(0, 256)).to(tl.int32)
        tl.store(lean_ptr + tl.arange(0, 256), triton_numerics.e8m0_decode_lean(b))
        tl.store(full_ptr + tl.arange(0, 256), triton_numerics.e8m0_decode(b))

    b = torch.arange(256, dtype=torch.uint8, device=triton_device)
    lean, full = (torch.empty(256, dtype=torch.float32, device=triton_device) for _ in range(2))
    _decode[(1,)](b, lean, full)
    ref = e8m0.decode(b.cpu()).float()
    for out, what in ((lean.cpu(), "lean"), (full.cpu(), "full")):
        assert torch.equal(out.isnan(), ref.isnan()) and out[255].isnan(), f"{what}: NaN only at byte 255"
        assert torch.equal(out[:255].view(torch.int32), ref[:255].view(torch.int32)), f"{what}: the bits of 2**(b - 127), b < 255"
    assert lean[0].item() == 2.0**-127 and lean[127].item() == 1.0 and lean[254].item() == 2.0**127
