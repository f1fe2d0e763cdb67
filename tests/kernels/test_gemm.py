"""Triton block-scaled GEMMs (FP8-block, MXFP8 emulated, MXFP8 dequantized to bf16) against
the torch references of quantkit/kernels/gemm/gemm_ref.py, which dequantize with quantkit.formats.

CPU: Triton's interpreter (conftest.py), tiny awkward shapes: M = 1, K not a multiple of 128,
N not a multiple of the tile, swap-AB, split-K, bias, TMA, persistent tiles; the small-M kernel
with the tensor-core dot and the CUDA-core reduction.  Same fp8 inputs and float32 accumulation
as the reference, so a float32 output agrees to summation order (rel 1e-5).  A bfloat16 output
may differ by one bf16 ulp: the interpreter truncates float32 -> bfloat16 (the GPU rounds to
nearest even), and a different summation order can flip a rounding on the GPU.

GPU (-m gpu): the kernels compiled, on the shapes of the served models (K = 2880, N = 2112).
The fp8 tensor core accumulates each 32..128-long dot with ~14 mantissa bits (DeepSeek-V3
report) before the float32 promotion, as DeepGEMM and cuBLAS do, so the GPU tolerance is 1e-3
of |ref| + 1e-3 of max|ref| (plus one bf16 ulp for bf16 outputs); indexing or scale bugs give
errors of order 1.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quantkit.formats import exact, fp8_block, mxfp8
from quantkit.kernels import dispatch
from quantkit.kernels.gemm.block_scaled import WORKSPACE, Config, Side, Workspace, auto_split, split_plan
from quantkit.kernels.gemm.mxfp8 import mx_to_bf16
from quantkit.kernels.gemm.skinny import SkinnyConfig, block_m_for, scale_words_ok, skinny_split
from quantkit.kernels.gemm.wgmma import WgmmaConfig
from quantkit.kernels.gemm.wgmma import splits as wgmma_splits
from quantkit.kernels.gemm.gemm_ref import gemm_fp8_block_ref, gemm_mxfp8_ref

HAS_CUDA = torch.cuda.is_available()
BF16_ULP = 2.0**-7  # spacing of bfloat16 relative to the value, at worst


GPU_REL = 1e-3  # the compiled fp8 tensor core's accumulation (module docstring)


def assert_gemm_close(out: torch.Tensor, ref: torch.Tensor, what: str, rel: float) -> None:
    """|out - ref| <= rel * |ref| + rel * max|ref| (+ one bf16 ulp for bf16 outputs); names the worst
    element.  A CUDA output comes from the compiled kernels: rel is at least GPU_REL there."""
    if out.is_cuda:
        rel = max(rel, GPU_REL)
    o, r = out.float().cpu(), ref.float().cpu()
    assert o.shape == r.shape, f"{what}: shape {tuple(o.shape)}, want {tuple(r.shape)}"
    ulp = BF16_ULP if out.dtype == torch.bfloat16 else 0.0
    scale = r.abs().max().clamp(min=1e-30)
    excess = (o - r).abs() - (rel + ulp) * r.abs() - rel * scale
    i = int(excess.argmax())
    row, col = divmod(i, r.shape[-1]) if r.dim() == 2 else (i, 0)
    assert excess.flatten()[i] <= 0, f"{what}: worst element [{row}, {col}] got {o.flatten()[i].item()!r}, want {r.flatten()[i].item()!r} (max|ref| {scale.item():.4g})"
    norm_rel = ((o - r).norm() / r.norm().clamp(min=1e-30)).item()
    assert norm_rel <= rel + ulp / 2, f"{what}: relative error {norm_rel:.3g} over the whole output"


def fp8_block_case(m: int, n: int, k: int, gen: torch.Generator, bias: bool, device) -> tuple:
    x = torch.randn(m, k, generator=gen) * torch.logspace(-1, 1, k)  # channel magnitudes 0.1 .. 10
    w = torch.randn(n, k, generator=gen) * 0.02
    a, sa = fp8_block.quantize_act(x)
    q, sw = fp8_block.quantize_weight(w)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    return tuple(t.to(device) if t is not None else None for t in (a, sa, q, sw, b))


def mx_case(m: int, n: int, k: int, gen: torch.Generator, bias: bool, device, pow2_weight: bool = False) -> tuple:
    x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, k)
    w = torch.randn(n, k, generator=gen) * 0.02
    a, sa = mxfp8.quantize(x)
    q, sw = exact.fp8_block_pow2_to_mxfp8(*fp8_block.quantize_weight(w, "ue8m0")) if pow2_weight else mxfp8.quantize(w)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    return tuple(t.to(device) if t is not None else None for t in (a, sa, q, sw, b))


def triton_call(op: str, *args, **kw):
    return dispatch.call(op, *args, backend="triton", **kw)


# (m, n, k, config): M = 1, K % 128 != 0, N not a multiple of the tile, swap-AB, split-K, wide tiles
FP8_CASES = [
    (3, 80, 200, Config(16, 32)),
    (1, 150, 130, Config(16, 64, swap_ab=True)),
    (5, 200, 300, Config(16, 64, swap_ab=True, split_k=3)),
    (33, 136, 256, Config(32, 256, split_k=2, num_warps=8)),
    (1, 96, 640, Config(16, 32, split_k=0)),  # auto split on the interpreter's 8 "SMs"
    (9, 200, 304, Config(16, 64, tma=True)),  # TMA descriptors: zero-filled K tail and rows
    (5, 136, 304, Config(16, 64, swap_ab=True, split_k=2, tma=True)),
    (40, 136, 304, Config(16, 64, tma=True, persistent=1)),  # 3 x 3 tiles on 8 programs: some loop twice
    (1, 200, 300, SkinnyConfig()),  # small-M kernel, tensor core, masked K tail, partial weight tile
    (3, 96, 640, SkinnyConfig(block_n=32)),  # auto split-K: 3 x 2 K-blocks
    (20, 136, 384, SkinnyConfig(block_m=16, split_k=3)),  # two token tiles, split-K
    (1, 150, 130, SkinnyConfig(dot=False, chunk=64)),  # CUDA-core reduction, M = 1
    (3, 72, 400, SkinnyConfig(block_n=32, block_m=2, dot=False, chunk=32, split_k=2)),
    (1, 96, 640, SkinnyConfig(block_n=32, unsplit_kb=16)),  # K of 5 blocks left whole (the auto split would cut it in 2)
]


@pytest.mark.parametrize("m,n,k,cfg", FP8_CASES, ids=[c[3].name() for c in FP8_CASES])
def test_fp8_block_gemm_matches_reference(triton_device, gen, m, n, k, cfg):
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, True, triton_device)
    ref = gemm_fp8_block_ref(a.cpu(), sa.cpu(), q.cpu(), sw.cpu(), b.cpu(), torch.float32)
    out32 = triton_call("gemm_fp8_block", a, sa, q, sw, b, torch.float32, config=cfg)
    assert_gemm_close(out32, ref, f"fp8-block {m}x{n}x{k} {cfg.name()} f32", 1e-5)
    out16 = triton_call("gemm_fp8_block", a, sa, q, sw, b, torch.bfloat16, config=cfg)
    assert out16.dtype == torch.bfloat16
    assert_gemm_close(out16, ref, f"fp8-block {m}x{n}x{k} {cfg.name()} bf16", 1e-5)


def test_fp8_block_gemm_leading_dims_and_no_bias(triton_device, gen):
    a, sa, q, sw, _ = fp8_block_case(6, 64, 256, gen, False, triton_device)
    a3, sa3 = a.reshape(2, 3, 256), sa.reshape(2, 3, 2)
    out = triton_call("gemm_fp8_block", a3, sa3, q, sw, None, torch.float32)  # default config table
    assert out.shape == (2, 3, 64)
    assert_gemm_close(out.reshape(6, 64), gemm_fp8_block_ref(a.cpu(), sa.cpu(), q.cpu(), sw.cpu(), None, torch.float32), "fp8-block [2, 3, K]", 1e-5)


MX_CASES = [
    (3, 80, 224, Config(16, 32)),
    (3, 80, 224, Config(16, 32, upcast=True)),
    (5, 200, 288, Config(16, 64, swap_ab=True, split_k=3)),
    (1, 200, 288, Config(16, 64, swap_ab=True, split_k=2, upcast=True)),
    (33, 130, 256, Config(32, 256, split_k=2, num_warps=8)),
    (3, 80, 224, Config(16, 32, tma=True)),
    (2, 72, 224, Config(16, 64, swap_ab=True, upcast=True, tma=True)),
    (1, 200, 288, SkinnyConfig()),  # small-M kernel, block-diagonal dot: 4-row token tile, byte scales, masked tail
    (5, 96, 640, SkinnyConfig(block_n=32, split_k=2)),  # 8-row tile, scales read as int32 words (K % 128 == 0)
    (13, 72, 512, SkinnyConfig(split_k=3)),  # 16-row tile, padding rows, words, uneven split
    (20, 64, 288, SkinnyConfig(block_m=16)),  # two token tiles
    (3, 200, 288, SkinnyConfig(diag=False)),  # one promoted dot per 32 columns
    (6, 96, 640, SkinnyConfig(block_n=32, split_k=2, diag=False)),
    (2, 72, 224, SkinnyConfig(dot=False, chunk=32)),
    (1, 200, 288, SkinnyConfig(upcast=True)),  # small-M, exact bf16 operands: one dot per 128 columns, masked tail
    (5, 96, 640, SkinnyConfig(block_n=32, split_k=2, upcast=True)),
]


@pytest.mark.parametrize("m,n,k,cfg", MX_CASES, ids=[c[3].name() for c in MX_CASES])
def test_mxfp8_gemm_matches_reference(triton_device, gen, m, n, k, cfg):
    a, sa, q, sw, b = mx_case(m, n, k, gen, True, triton_device)
    ref = gemm_mxfp8_ref(a.cpu(), sa.cpu(), q.cpu(), sw.cpu(), b.cpu(), torch.float32)
    out = triton_call("gemm_mxfp8", a, sa, q, sw, b, torch.float32, config=cfg)
    assert_gemm_close(out, ref, f"mxfp8 {m}x{n}x{k} {cfg.name()}", 1e-5)


def test_mxfp8_small_m_reads_scale_words_of_strided_rows(triton_device, gen):
    """Scales in padded rows (stride 20 > 16 columns, still 4-byte aligned) take the int32-word path; an odd
    stride falls back to bytes; both give the reference."""
    a, sa, q, sw, b = mx_case(6, 96, 512, gen, True, triton_device)
    ref = gemm_mxfp8_ref(a.cpu(), sa.cpu(), q.cpu(), sw.cpu(), b.cpu(), torch.float32)
    for pad in (4, 3):
        sa_p = torch.full((6, 16 + pad), 0xFF, dtype=torch.uint8, device=triton_device)[:, :16]
        sw_p = torch.full((96, 16 + pad), 0xFF, dtype=torch.uint8, device=triton_device)[:, :16]
        sa_p.copy_(sa.view(torch.uint8)), sw_p.copy_(sw.view(torch.uint8))
        assert scale_words_ok(Side(a, sa_p, 1, 32)) == (pad == 4)
        out = triton_call("gemm_mxfp8", a, sa_p, q, sw_p, b, torch.float32, config=SkinnyConfig())
        assert_gemm_close(out, ref, f"mxfp8 scale rows padded by {pad}", 1e-5)


def test_mxfp8_small_m_special_scales_match_reference(triton_device, gen):
    """E8M0 byte 0xFF (NaN) poisons its weight row or token, as in the reference; byte 0 is 2**-127."""
    a, sa, q, sw, _ = mx_case(3, 64, 256, gen, False, triton_device)
    sw, sa = sw.view(torch.uint8).clone(), sa.view(torch.uint8).clone()
    sw[5, 2], sa[1, 6] = 0xFF, 0xFF
    sw[9, :] = 0  # every block of row 9 at 2**-127: the products are float32 subnormals
    q[9] = q[9].float().abs().to(torch.float8_e4m3fn)
    ref = gemm_mxfp8_ref(a.cpu(), sa.cpu(), q.cpu(), sw.cpu(), None, torch.float32)
    for cfg in (SkinnyConfig(), SkinnyConfig(diag=False)):
        dev_out = triton_call("gemm_mxfp8", a, sa, q, sw, None, torch.float32, config=cfg)  # on CUDA: the GPU bound applies
        out = dev_out.cpu()
        assert torch.equal(out.isnan(), ref.isnan()), f"{cfg.name()}: NaN at {out.isnan().nonzero().tolist()}, want {ref.isnan().nonzero().tolist()}"
        fin = ~ref.isnan()
        assert_gemm_close(dev_out[fin.to(dev_out.device)], ref[fin], f"mxfp8 special scales {cfg.name()}", 1e-5)
        assert (ref[:, 9] != 0).any() and torch.equal(out[:, 9] != 0, ref[:, 9] != 0)


def test_mxfp8_gemm_rejects_k_not_multiple_of_32(triton_device):
    a = torch.zeros(2, 48, dtype=torch.float8_e4m3fn, device=triton_device)
    s = torch.zeros(2, 2, dtype=torch.uint8, device=triton_device)
    with pytest.raises(ValueError, match="multiple of 32"):
        triton_call("gemm_mxfp8", a, s, a, s)


def test_launcher_asserts_layouts(triton_device, gen):
    a, sa, q, sw, _ = fp8_block_case(2, 64, 256, gen, False, triton_device)
    with pytest.raises(AssertionError, match="scale grid"):
        triton_call("gemm_fp8_block", a, sa, q, sw[:, :1].contiguous())
    with pytest.raises(AssertionError, match="E4M3"):
        triton_call("gemm_fp8_block", a.float(), sa, q, sw)
    with pytest.raises(AssertionError, match="contiguous dim"):
        triton_call("gemm_fp8_block", a, sa, q.t().contiguous().t(), sw)
    with pytest.raises(AssertionError, match="power-of-two"):  # float 1x128 scales are not
        triton_call("gemm_fp8_block", a, sa, q, sw, config=Config(16, 32, upcast=True))
    with pytest.raises(AssertionError, match="power-of-two"):
        triton_call("gemm_fp8_block", a, sa, q, sw, config=SkinnyConfig(upcast=True))
    a, sa, q, sw, _ = fp8_block_case(2, 64, 200, gen, False, triton_device)
    with pytest.raises(AssertionError, match="16-byte aligned"):  # K = 200 bytes per row
        triton_call("gemm_fp8_block", a, sa, q, sw, config=Config(16, 32, tma=True))
    with pytest.raises(AssertionError, match="persistent programs need TMA"):
        triton_call("gemm_fp8_block", a, sa, q, sw, config=Config(16, 32, persistent=1))
    with pytest.raises(AssertionError, match="BLOCK_N must divide"):  # 128-row scale tiles
        triton_call("gemm_fp8_block", a, sa, q, sw, config=SkinnyConfig(block_n=256))
    with pytest.raises(AssertionError, match="BLOCK_M >= 16"):
        triton_call("gemm_fp8_block", a, sa, q, sw, config=SkinnyConfig(block_m=8))


def test_mx_to_bf16_is_the_exact_dequantization(triton_device, gen):
    x = torch.randn(5, 96, generator=gen) * torch.logspace(-20, 20, 96)  # scales far from 1 both ways
    q, s = mxfp8.quantize(x)
    want = mxfp8.dequantize(q, s)  # float32, exact
    got = mx_to_bf16(q.to(triton_device), s.to(triton_device)).cpu()
    assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want), "bf16 dequantization must be exact"


def test_mxfp8_dequant_bf16_path(triton_device, gen):
    for m in (3, 70):
        a, sa, q, sw, b = mx_case(m, 80, 224, gen, True, triton_device)
        ref = gemm_mxfp8_ref(a.cpu(), sa.cpu(), q.cpu(), sw.cpu(), b.cpu(), torch.float32)
        for backend in ("dequant-bf16", "triton"):
            assert_gemm_close(dispatch.call("gemm_mxfp8", a, sa, q, sw, b, torch.float32, backend=backend), ref, f"mxfp8 {backend} M={m}", 1e-5)
    # auto runs the selection through the triton backend where Triton is compiled (interpreted: explicit backends only)
    assert dispatch.which("gemm_mxfp8", "cuda" if HAS_CUDA else "cpu") == ("triton" if HAS_CUDA else "torch")


def test_split_k_is_deterministic_and_leaves_counters_at_zero(triton_device, gen):
    a, sa, q, sw, b = fp8_block_case(3, 96, 640, gen, True, triton_device)
    ws = Workspace()
    cfg = SkinnyConfig(block_n=32, split_k=5)
    first = triton_call("gemm_fp8_block", a, sa, q, sw, b, torch.float32, config=cfg, workspace=ws)
    counters = ws.counters(1, triton_device)
    assert counters.numel() >= 3 and not counters.any(), "every tile's counter is reset by its last program"
    again = triton_call("gemm_fp8_block", a, sa, q, sw, b, torch.float32, config=cfg, workspace=ws)
    assert torch.equal(first, again), "split-K sums in split order: bit-identical results"
    tiled = triton_call("gemm_fp8_block", a, sa, q, sw, b, torch.float32, config=Config(16, 32, split_k=3), workspace=ws)
    assert not ws.counters(1, triton_device).any()
    assert_gemm_close(tiled, first, "tiled split-K vs small-M split-K", 1e-5)


def test_workspace_grows_and_keeps_old_buffers():
    ws = Workspace()
    small = ws.partials(10, torch.device("cpu"))
    assert ws.partials(5, torch.device("cpu")) is small, "a cached buffer is reused, not reallocated"
    big = ws.partials(11, torch.device("cpu"))
    assert big.numel() == 20 and big is not small, "growth at least doubles"
    assert any(t is small for t in ws._retired), "a replaced buffer stays alive for graphs that captured it"
    assert ws.counters(4, torch.device("cpu")).dtype == torch.int32 and not ws.counters(4, torch.device("cpu")).any()
    assert isinstance(WORKSPACE, Workspace)


def test_split_rules():
    # narrow tiles first: DeepSeek-V3 o at M = 128 takes 112 tiles of 64 columns, which fill the SMs without a split
    assert wgmma_splits(128, 7168, 16384, WgmmaConfig(split_k=0, block_n=0), 132) == (1, 128)
    # DeepSeek-V3 o at M = 128: 56 tiles, 128 K-blocks -> 2 runs of 64; q_a+kv_a (17 tiles, 56 blocks) -> 2 of 28
    assert wgmma_splits(128, 7168, 16384, WgmmaConfig(split_k=0), 132) == (2, 64)
    assert wgmma_splits(100, 2112, 7168, WgmmaConfig(split_k=0), 132) == (2, 28)
    assert wgmma_splits(128, 5120, 2880, WgmmaConfig(split_k=0), 132) == (1, 23), "23 K-blocks: too short to split"
    assert wgmma_splits(256, 7168, 16384, WgmmaConfig(split_k=0), 132) == (1, 128), "112 tiles: one run each fills the SMs"
    assert wgmma_splits(64, 2880, 2880, WgmmaConfig(split_k=3), 132) == (3, 8), "explicit: 8 + 8 + 7 blocks"
    assert wgmma_splits(64, 2880, 2880, WgmmaConfig(split_k=30), 132) == (23, 1), "never an empty run"
    assert wgmma_splits(64, 2880, 2880, WgmmaConfig(split_k=9), 132) == (8, 3), "9 wanted: runs of 3 blocks leave 8"
    assert auto_split(tiles=45, n_kb=23, sms=132) == 6  # (2880, 2880) at M=1: 45 weight tiles of 64 rows
    assert auto_split(tiles=512, n_kb=4, sms=132) == 1  # (32768, 512): enough tiles already
    assert auto_split(tiles=10, n_kb=3, sms=132) == 1  # too little K to split
    assert split_plan(6, 23) == (6, 4) and split_plan(8, 9) == (5, 2), "no empty split"
    cfg = SkinnyConfig(block_n=64, waves=4)
    assert block_m_for(1, cfg) == 16 and block_m_for(17, cfg) == 32 and block_m_for(3, SkinnyConfig(dot=False)) == 4
    assert block_m_for(1000, cfg) == 128, "auto token tiles stop at 128"
    assert block_m_for(1, cfg, 4) == 4 and block_m_for(5, cfg, 4) == 8 and block_m_for(3, cfg, 2) == 8, "block-diagonal dots: 16 columns from 16 / G rows"
    # (7168, 16384) at M=1: 112 tiles, 4 waves on 132 SMs -> 5 splits of 26 K-blocks
    assert skinny_split(cfg, tiles=112, k=16384, block_m=16, sms=132) == (5, 26)
    # (24576, 1536) at M=64: 384 tiles -> 2 splits of 6 K-blocks
    assert skinny_split(cfg, tiles=384, k=1536, block_m=64, sms=132) == (2, 6)
    # (2880, 512) at M=64: 12 splits wanted, but the partial sums would outweigh the weight -> none
    assert skinny_split(cfg, tiles=45, k=512, block_m=64, sms=132) == (1, 4)
    # (2880, 2880) at M=1: 45 tiles -> 12 splits wanted, capped at 11 (2 K-blocks each) -> 8 x 3 blocks
    assert skinny_split(cfg, tiles=45, k=2880, block_m=16, sms=132) == (8, 3)
    # unsplit_kb = 16 leaves K <= 2048 whole and splits a longer K
    whole = SkinnyConfig(waves=2, unsplit_kb=16)
    assert skinny_split(whole, tiles=112, k=2048, block_m=16, sms=132) == (1, 16)
    assert skinny_split(replace(whole, unsplit_kb=0), tiles=112, k=2048, block_m=16, sms=132) == (3, 6)
    assert skinny_split(whole, tiles=45, k=2880, block_m=16, sms=132) == (6, 4), "K = 2880 (23 blocks) is still split"
    assert skinny_split(SkinnyConfig(unsplit_kb=16, split_k=3), tiles=112, k=2048, block_m=16, sms=132) == (3, 6), "an explicit split wins"


# ---- GPU: compiled kernels on the served models' awkward shapes --------------------------------

GPU_SHAPES = [(1, 2112, 2880), (16, 2112, 2880), (64, 2880, 2880), (200, 2112, 7168), (1024, 2112, 2880), (1100, 2112, 7168)]


def gpu_configs(m: int) -> list:
    """The launch variants the benchmark sweeps, each checked on this shape."""
    bm = 0 if m <= 128 else 64  # larger M: several token tiles
    cfgs = [SkinnyConfig(block_m=bm), SkinnyConfig(block_n=128, block_m=bm, num_warps=8), Config(16, 64, swap_ab=True, split_k=4),
            Config(64, 128, num_stages=4), Config(128, 128, num_warps=8, num_stages=4), Config(64, 128, split_k=0)]  # fmt: skip
    cfgs += [replace(c, tma=True) for c in cfgs if isinstance(c, Config)] + [Config(64, 128, tma=True, persistent=2)]
    cfgs += [WgmmaConfig(), WgmmaConfig(stages=4, unroll=2), WgmmaConfig(unroll=1)]  # any M: one tile's rows or many
    cfgs += [WgmmaConfig(split_k=3), WgmmaConfig(split_k=0), WgmmaConfig(unroll=1, split_k=2)]  # split-K, a partial last run
    if m <= 16:
        cfgs += [SkinnyConfig(dot=False, chunk=32, block_n=32), SkinnyConfig(dot=False, chunk=64, block_m=1 if m == 1 else 0)]
    return cfgs


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_gpu_fp8_block_gemm(gen, m, n, k):
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, True, "cuda")
    ref = gemm_fp8_block_ref(a, sa, q, sw, b, torch.float32)
    assert_gemm_close(triton_call("gemm_fp8_block", a, sa, q, sw, b, torch.float32), ref, f"fp8-block {m}x{n}x{k} f32", 1e-3)
    assert_gemm_close(triton_call("gemm_fp8_block", a, sa, q, sw, b), ref, f"fp8-block {m}x{n}x{k} bf16", 1e-3)
    for cfg in gpu_configs(m):
        assert_gemm_close(triton_call("gemm_fp8_block", a, sa, q, sw, b, config=cfg), ref, f"fp8-block {m}x{n}x{k} {cfg.name()}", 1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_gpu_mxfp8_gemm(gen, m, n, k):
    a, sa, q, sw, b = mx_case(m, n, k, gen, True, "cuda")
    ref = gemm_mxfp8_ref(a, sa, q, sw, b, torch.float32)
    for up in (False, True):
        cfg = Config(64, 128, upcast=up, tma=m > 64) if m > 64 else Config(16, 64, swap_ab=True, split_k=0, upcast=up)
        assert_gemm_close(triton_call("gemm_mxfp8", a, sa, q, sw, b, config=cfg), ref, f"mxfp8 {m}x{n}x{k} {cfg.name()}", 1e-3)
    assert_gemm_close(triton_call("gemm_mxfp8", a, sa, q, sw, b), ref, f"mxfp8 {m}x{n}x{k} selected", 1e-3)
    for backend in ("dequant-bf16", "auto"):
        out = dispatch.call("gemm_mxfp8", a, sa, q, sw, b, backend=backend)
        assert_gemm_close(out, ref, f"mxfp8 {backend} {m}x{n}x{k}", 1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (5, 2880, 2880), (13, 4096, 1536), (32, 2112, 7168), (64, 5760, 2880)])
def test_gpu_mxfp8_small_m_variants(gen, m, n, k):
    """The small-M MX kernels: block-diagonal dot (scale words where K % 128 == 0, bytes otherwise), one dot
    per 32 columns, upcast operands; the first two add the same float32 products and agree to rounding."""
    a, sa, q, sw, b = mx_case(m, n, k, gen, True, "cuda")
    ref = gemm_mxfp8_ref(a, sa, q, sw, b, torch.float32)
    outs = {}
    for cfg in (SkinnyConfig(waves=2), SkinnyConfig(waves=2, diag=False), SkinnyConfig(waves=2, upcast=True), SkinnyConfig(block_n=128, waves=4)):
        outs[cfg.name()] = out = triton_call("gemm_mxfp8", a, sa, q, sw, b, torch.float32, config=cfg)
        assert_gemm_close(out, ref, f"mxfp8 {m}x{n}x{k} {cfg.name()}", 1e-3)
    diag, old = outs[SkinnyConfig(waves=2).name()], outs[SkinnyConfig(waves=2, diag=False).name()]
    gap = ((diag - old).abs() / (old.abs() + old.abs().max())).max().item()
    assert gap <= 1e-6, f"mxfp8 {m}x{n}x{k}: block-diagonal and per-32 dots differ by {gap:.2e} of |out| + max|out|"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m,cfg", [(4, SkinnyConfig(split_k=4)), (64, SkinnyConfig()), (300, Config(64, 128, split_k=3)), (1100, Config(64, 128, tma=True)), (1100, WgmmaConfig()),
                                   (100, WgmmaConfig(split_k=3)), (300, WgmmaConfig(split_k=2))])  # fmt: skip
def test_gpu_cuda_graph_replays_match_eager(gen, m, cfg):
    """Captured once, replayed on new inputs: the same bits as eager launches, counters back at zero."""
    n, k = 2112, 2880
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, True, "cuda")
    ws = Workspace()
    call = lambda: triton_call("gemm_fp8_block", a, sa, q, sw, b, config=cfg, workspace=ws)  # noqa: E731
    call()  # warm-up: compiles, sizes the workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for _ in range(2):
        a2, sa2, _, _, _ = fp8_block_case(m, n, k, gen, False, "cuda")
        a.copy_(a2), sa.copy_(sa2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call()), f"graph replay differs from eager ({cfg.name()})"
        assert not ws.counters(1, a.device).any()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_the_printed_map_is_what_runs():
    """Every GEMM row of ``quantkit kernels --device cuda`` names the leaf and config that auto chooses for real
    operands of that shape on this device (the map is read from a bare target, the call from the probed one)."""
    from quantkit.kernels.gemm.select import MAP_MS, MAP_SHAPES

    dev = torch.device("cuda")
    rows = {(r.op, r.case, r.m): r.choice for r in dispatch.kernel_map(dispatch.target(dev)) if r.op.startswith("gemm_")}
    assert len(rows) == 2 * len(MAP_SHAPES) * len(MAP_MS)
    checked = 0
    for (op, case, m), want in rows.items():
        n, k = (int(x) for x in case.rsplit("[", 1)[1].rstrip("]").split(", "))
        a = torch.empty(int(m), k, dtype=torch.float8_e4m3fn, device=dev)
        w = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=dev)
        if op == "gemm_fp8_block":
            sa, sw = torch.ones(int(m), -(-k // 128), device=dev), torch.ones(-(-n // 128), -(-k // 128), device=dev)
        else:
            sa = torch.full((int(m), k // 32), 127, dtype=torch.uint8, device=dev)
            sw = torch.full((n, k // 32), 127, dtype=torch.uint8, device=dev)
        got = dispatch.choose(op, a, sa, w, sw)
        assert (got.kernel, got.config) == (want.kernel, want.config), f"{op} {case} M={m}: map {want}, runs {got}"
        checked += 1
    assert checked == len(rows)
