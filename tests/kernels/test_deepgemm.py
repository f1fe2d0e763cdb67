"""The DeepGEMM backend (FlashInfer's copy of DeepGEMM's SM90 kernel, compiled per shape): its tile
rule, operand layouts and errors on the CPU; the compile where nvcc and the headers exist; on the
H200 (-m gpu) the kernel against the float32 reference, grouped contiguous, CUDA graphs, auto's DeepGEMM leaf."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from .test_gemm import assert_gemm_close, fp8_block_case
from .test_gemm_cublas import check_fp8_backend

from quantkit.formats import fp8_block
from quantkit.kernels.gemm import deepgemm as dg
from quantkit.kernels import dispatch
from quantkit.kernels.gemm import select
from quantkit.kernels.gemm.gemm_ref import gemm_fp8_block_ref

HAS_CUDA = torch.cuda.is_available()
HEADERS = os.environ.get("QUANTKIT_TEST_DEEPGEMM_INCLUDE")  # a tensorrt_llm folder with deep_gemm/, where FlashInfer is not installed
if HEADERS:
    dg.configure(include_dir=HEADERS)
CAN_BUILD = dg.include_dir() is not None and dg.nvcc_path() is not None


def test_best_config_follows_deepgemms_rule():
    # M = 4096, N = 7168, K = 2048 on 132 SMs: 32 row blocks; BLOCK_N 128 gives 56 x 32 = 1792 tiles,
    # 14 waves, and no narrower tile has fewer; 6 stages need 32768 + 6 * 33280 + 64 + 96 = 232608 bytes
    # (> 232448), 5 need 199312; N = 7168 splits into 256-column pairs, so a 2-block cluster.
    assert dg.best_config(4096, 7168, 2048, 132) == dg.Config(128, 128, 5, 2, 199312)
    # M = 64, N = 2112: one 64-row block; BLOCK_N 16 -> 132 tiles, exactly one full wave (24 -> 88 tiles,
    # also one wave but a less full one); 128 % 16 == 0 allows 8 stages: 2048 + 8 * (8192 + 2048 + 256)
    # + 56 * 4 + 128 = 86368 bytes.
    assert dg.best_config(64, 2112, 7168, 132) == dg.Config(64, 16, 8, 1, 86368)
    # grouped contiguous always takes 128-row tiles, even for a few rows
    assert dg.best_config(128, 4096, 7168, 132, contiguous=True).block_m == 128


@pytest.mark.parametrize("m", [1, 17, 64, 65, 300, 1024, 8192])
@pytest.mark.parametrize("n,k", [(2112, 7168), (24576, 1536), (2880, 2944), (4096, 8192), (7168, 16384)])
def test_best_config_fits_and_uses_fewest_waves(m, n, k):
    c = dg.best_config(m, n, k, 132)
    assert c.smem <= dg.SM90_SMEM and c.stages >= 4 and 16 <= c.block_n <= 128 and c.block_n % 8 == 0
    assert c.smem == dg.smem_size(c.stages, k, c.block_m, c.block_n)
    most = 8 if 128 % c.block_n == 0 else 6  # DeepGEMM's stage candidates
    assert dg.smem_size(c.stages + 1, k, c.block_m, c.block_n) > dg.SM90_SMEM or c.stages == most
    tiles = lambda bn: -(-m // c.block_m) * -(-n // bn)  # noqa: E731
    assert all(-(-tiles(bn) // 132) >= -(-tiles(c.block_n) // 132) for bn in range(16, 129, 8))
    assert c.multicast == (2 if m >= 1024 and n % (2 * c.block_n) == 0 else 1)


def test_config_m_buckets():
    assert [dg.config_m(m) for m in (1, 33, 64, 65, 128, 129, 1000, 1024, 1025)] == [64, 64, 64, 128, 128, 256, 1024, 1024, 2048]


def test_prepare_weight_layouts_and_errors(gen):
    w = torch.randn(2, 256, 2880, generator=gen) * 0.02
    q, s = zip(*(fp8_block.quantize_weight(w[e]) for e in range(2)))
    stacked = torch.stack(q)
    dw = dg.prepare_weight(stacked, torch.stack(s))
    assert (dw.n, dw.k, dw.groups) == (256, 2880, 2) and dw.w.shape == (512, 2880) and dw.w.dtype == torch.float8_e4m3fn
    assert dw.w.data_ptr() == stacked.data_ptr(), "no copy: TMA zero-fills K past 2880"
    assert torch.equal(dw.w[256:].view(torch.uint8), q[1].view(torch.uint8))
    with pytest.raises(ValueError, match="K=2888 is not a multiple of 16"):
        dg.prepare_weight(torch.zeros(256, 2888, dtype=torch.float8_e4m3fn), torch.ones(2, 23))
    with pytest.raises(ValueError, match="N=100 is not a multiple of 8"):
        dg.prepare_weight(torch.zeros(100, 256, dtype=torch.float8_e4m3fn), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"weight scales \(2, 3\) do not fit a weight \(256, 256\)"):
        dg.prepare_weight(torch.zeros(256, 256, dtype=torch.float8_e4m3fn), torch.ones(2, 3))


@pytest.mark.parametrize("m", [1, 5, 8])
def test_prepare_act_scales_are_mn_major(gen, m):
    x = torch.randn(m, 304, generator=gen)
    a, sa = fp8_block.quantize_act(x)
    ap, st = dg.prepare_act(a, sa)
    assert ap.data_ptr() == a.data_ptr() and ap.shape == (m, 304)
    assert st.shape == (3, -(-m // 4) * 4) and st.is_contiguous()
    assert torch.equal(st[:, :m], sa.t()) and not st[:, m:].any()
    _, sa_mn = fp8_block.quantize_act(x, scale_mn=True)  # written MN-major: its own buffer, no copy
    _, st_mn = dg.prepare_act(a, sa_mn)
    assert torch.equal(st_mn, st) and st_mn.data_ptr() == sa_mn.data_ptr()


def test_no_rows_no_launch():
    dw = dg.prepare_weight(torch.zeros(256, 256, dtype=torch.float8_e4m3fn), torch.ones(2, 2))
    out = dg.gemm_prepared(torch.zeros(0, 256, dtype=torch.float8_e4m3fn), torch.zeros(2, 0), dw)
    assert out.shape == (0, 256) and out.dtype == torch.bfloat16


def h200(dg_ok) -> dispatch.Target:
    return dispatch.Target("cuda", (9, 0), 132, "sm_90", frozenset({"deepgemm"}) if dg_ok else frozenset())


def test_availability():
    assert not dg.available(torch.device("cpu")).ok and "CUDA" in dg.available(torch.device("cpu")).reason


def test_auto_falls_back_to_triton_after_a_failed_build(monkeypatch):
    """auto's DeepGEMM leaf: a failed build switches DeepGEMM off on the device (with a warning) and runs the Triton
    selection, now and from then on; a float32 output never reaches DeepGEMM (it writes bf16)."""
    from quantkit.kernels.gemm import fp8_block

    cpu = torch.device("cpu")
    monkeypatch.setattr(dg, "_AVAIL", {str(cpu): dispatch.Availability(True, auto=False)})
    monkeypatch.setattr(select, "device_target", lambda device: h200(dg.available_cached(device).ok))

    def broken(*args, **kwargs):
        raise dg.BuildError("DeepGEMM build failed for N=4096 K=2048: nvcc fatal")

    monkeypatch.setattr(dg, "gemm_fp8_block_deepgemm", broken)
    monkeypatch.setattr(fp8_block, "gemm_fp8_block", lambda *args, **kwargs: "triton ran")
    a, w = torch.zeros(64, 2048, dtype=torch.float8_e4m3fn), torch.zeros(4096, 2048, dtype=torch.float8_e4m3fn)
    c32 = select.choose_fp8_block(a, None, w, None, None, torch.float32)
    assert c32.kernel.startswith("triton.") and c32.run(a, None, w, None, None, torch.float32) == "triton ran"
    c = select.choose_fp8_block(a, None, w, None)
    assert c.kernel == "deepgemm"
    with pytest.warns(UserWarning, match="DeepGEMM disabled on cpu, running Triton"):
        assert c.run(a, None, w, None) == "triton ran"
    assert not dg.available_cached(cpu).ok and "nvcc fatal" in dg.available_cached(cpu).reason
    assert select.choose_fp8_block(a, None, w, None).kernel.startswith("triton.")


@pytest.mark.skipif(not CAN_BUILD, reason="needs nvcc and FlashInfer's deep_gemm headers (or QUANTKIT_DEEPGEMM_INCLUDE)")
def test_build_compiles_and_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(dg.SETTINGS, "cache_dir", tmp_path)
    cfg = dg.best_config(256, 512, 256, 132)
    lib = dg.build(512, 256, cfg)
    assert hasattr(lib, "qk_launch") and len(list(tmp_path.glob("*.so"))) == 1
    assert dg.build(512, 256, cfg) is lib


def test_configure_points_at_other_headers_and_nvcc(tmp_path):
    saved = (dg.SETTINGS.include_dir, dg.SETTINGS.nvcc, dg.SETTINGS.cache_dir)
    try:
        dg.configure(include_dir=tmp_path, nvcc=tmp_path / "nvcc", cache_dir=tmp_path / "c")
        assert dg.include_dir() is None and dg.nvcc_path() is None, "an empty folder has no headers, a missing nvcc is none"
        (tmp_path / "deep_gemm").mkdir()
        (tmp_path / "deep_gemm" / "fp8_gemm_impl.cuh").write_text("")
        (tmp_path / "nvcc").write_text("")
        assert dg.include_dir() == tmp_path and dg.nvcc_path() == str(tmp_path / "nvcc") and dg._cache_dir() == tmp_path / "c"
    finally:
        dg.configure(*saved)
    assert (dg.SETTINGS.include_dir, dg.SETTINGS.nvcc, dg.SETTINGS.cache_dir) == saved, "configure() restores what it was given"
    assert dg._cache_dir() == (saved[2] or Path.home() / ".cache" / "quantkit" / "deepgemm")


# ---- GPU ----------------------------------------------------------------------------------------

GPU_OK = HAS_CUDA and dg.available(torch.device("cuda")).ok
needs_dg = pytest.mark.skipif(not GPU_OK, reason="needs sm_90, nvcc and the deep_gemm headers (flashinfer-python)")


@pytest.mark.gpu
@needs_dg
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (37, 4096, 512), (130, 2880, 2880), (1024, 7168, 2048)])
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_dense(gen, m, n, k, bias):
    check_fp8_backend(gen, m, n, k, bias, "deepgemm", "deepgemm")


@pytest.mark.gpu
@needs_dg
@pytest.mark.parametrize("k", [1024, 2880])  # 2880: TMA zero-fills the last K block of every expert
def test_gpu_grouped_contiguous_and_graph(gen, k):
    e, n = 5, 384
    w = torch.randn(e, n, k, generator=gen) * 0.02
    q, s = (torch.stack(t).cuda() for t in zip(*(fp8_block.quantize_weight(w[i]) for i in range(e))))
    counts = [130, 0, 1, 256, 77]  # an empty expert, one row, a full 2-block expert
    m_idx = torch.cat([torch.full((-(-c // 128) * 128,), i, dtype=torch.int32) for i, c in enumerate(counts)]).cuda()
    a, sa = (t.cuda() for t in fp8_block.quantize_act(torch.randn(m_idx.numel(), k, generator=gen)))
    dw = dg.prepare_weight(q, s)
    ap, st = dg.prepare_act(a, sa)
    out = dg.gemm_prepared(ap, st, dw, m_indices=m_idx)
    for i in range(e):
        rows = m_idx == i
        if rows.any():
            assert_gemm_close(out[rows], gemm_fp8_block_ref(a[rows], sa[rows], q[i], s[i], None, torch.float32), f"grouped expert {i}", 1e-3)
    with pytest.raises(ValueError, match="multiple of 128"):
        dg.gemm_prepared(ap[:200], st, dw, m_indices=m_idx[:200])
    graph_out = torch.empty_like(out)
    dg.gemm_prepared(ap, st, dw, m_indices=m_idx, out=graph_out)  # compiled and attributes set before capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dg.gemm_prepared(ap, st, dw, m_indices=m_idx, out=graph_out)
    graph_out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, out)


@pytest.mark.gpu
@needs_dg
def test_gpu_auto_runs_deepgemm_where_selected(gen):
    m, n, k = 64, 4096, 2048
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, True, "cuda")
    if dispatch.which("gemm_fp8_block", a, sa, q, sw, b) != "deepgemm":
        pytest.skip("the selection runs no DeepGEMM at this shape")
    out = dispatch.call("gemm_fp8_block", a, sa, q, sw, b)
    assert_gemm_close(out, gemm_fp8_block_ref(a, sa, q, sw, b, torch.float32), "auto -> deepgemm", 1e-3)
    assert torch.equal(out, dispatch.call("gemm_fp8_block", a, sa, q, sw, b, backend="deepgemm"))


@pytest.mark.gpu
@needs_dg
@pytest.mark.parametrize("m,n,k", [(33, 5120, 2880), (64, 2880, 2880), (48, 4096, 7168), (64, 2880, 4096)])
def test_gpu_auto_on_mn_major_scales_from_the_quantizer(gen, m, n, k):
    """The engine's path on a GPU: the Triton quantizer writes MN-major scales, auto hands their buffer to
    DeepGEMM (K = 2880 included: TMA zero-fills the last block); the bits equal the row-major run's."""
    x = (torch.randn(m, k, generator=gen) * 2).to(torch.bfloat16).cuda()
    a, sa = dispatch.call("act_quant_fp8_block", x, backend="triton", scale_mn=True)
    q, sw = (t.cuda() for t in fp8_block.quantize_weight(torch.randn(n, k, generator=gen) * 0.02))
    assert fp8_block.mn_major_storage(sa) is not None and dg.prepare_act(a, sa)[1].data_ptr() == sa.data_ptr()
    if dispatch.which("gemm_fp8_block", a, sa, q, sw) != "deepgemm":
        pytest.skip("the selection runs no DeepGEMM at this shape")
    out = dispatch.call("gemm_fp8_block", a, sa, q, sw)
    assert_gemm_close(out, gemm_fp8_block_ref(a, sa, q, sw, None, torch.float32), f"auto MN-major M={m} N={n} K={k}", 1e-3)
    assert torch.equal(out, dispatch.call("gemm_fp8_block", a, sa.contiguous(), q, sw, backend="deepgemm"))


def test_deepgemm_jobs_cover_what_auto_runs_and_prebuild_reports_failures(monkeypatch):
    """The warm-up list holds the kernel of every M at which auto sends a shape to DeepGEMM; prebuild compiles each
    once and returns the failures' messages."""
    monkeypatch.setattr(select, "device_target", lambda device: h200(True))
    shapes = [(7168, 2048), (32768, 512), (7168, 16384), (2880, 2888)]
    jobs = select.deepgemm_jobs(shapes + [(7168, 2048)], torch.device("cuda"))
    want = set()
    for n, k in shapes:
        for m in range(1, 4097):
            c = select.select_fp8_block(h200(True), m, n, k)
            if c.kernel == "deepgemm":
                want.add((n, k, c.config))
    assert jobs == want and {(n, k) for n, k, _ in jobs} == {(7168, 2048), (32768, 512), (7168, 16384)}, "K % 16 != 0: never DeepGEMM"
    built = []

    def fake_build(n, k, cfg):
        built.append((n, k, cfg))
        if k == 512:
            raise dg.BuildError("DeepGEMM build failed for N=32768 K=512: nvcc fatal")

    monkeypatch.setattr(dg, "build", fake_build)
    errors = dg.prebuild(jobs, workers=3)
    assert sorted(built, key=str) == sorted(jobs, key=str) and errors == ["DeepGEMM build failed for N=32768 K=512: nvcc fatal"]
