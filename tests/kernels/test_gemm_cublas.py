"""The GEMM ops' torch references, their registration, and the layouts of the benchmarks' cuBLAS baseline.

The reference is checked against DeepSeek's published per-tile formula (inference/kernel.py
fp8_gemm: per 128-K block, the product of the fp8 tiles times a_s * w_s, summed in float32).
The cuBLAS layouts follow torch's ScaledBlas.cpp checks for (BlockWise1x128, BlockWise128x128);
on CPU they are checked by reading the prepared tensors back the way cuBLAS reads them and by
torch's meta kernel; on the H200 (-m gpu) by running cuBLAS.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from .test_gemm import assert_gemm_close, fp8_block_case

from quantkit.kernels import dispatch
from quantkit.kernels.gemm import scaled_mm as sm
from quantkit.kernels.gemm.gemm_ref import gemm_fp8_block_ref

HAS_CUDA = torch.cuda.is_available()


def deepseek_fp8_gemm(a, sa, w, sw) -> torch.Tensor:
    """float32 [M, N]: sum over K blocks of (A_kb @ W_kb.T) * a_s[:, kb] * w_s[nb, kb] (partial tiles cut)."""
    m, k = a.shape
    n = w.shape[0]
    out = torch.zeros(m, n, dtype=torch.float64)
    for kb in range(sa.shape[1]):
        cols = slice(kb * 128, min(k, (kb + 1) * 128))
        part = a[:, cols].double() @ w[:, cols].double().T  # exact: fp8 products, float64 sums
        ws = sw[:, kb].double().repeat_interleave(128)[:n]
        out += part * sa[:, kb].double()[:, None] * ws[None, :]
    return out


@pytest.mark.parametrize("m,n,k", [(1, 80, 200), (7, 300, 384), (4, 2112 // 16, 2880 // 8)])
def test_reference_is_deepseeks_per_tile_formula(gen, m, n, k):
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, True, "cpu")
    want = deepseek_fp8_gemm(a, sa, q, sw) + b.double()
    got = gemm_fp8_block_ref(a, sa, q, sw, b, torch.float32)
    assert_gemm_close(got, want, "reference vs DeepSeek's formula", 1e-6)
    assert gemm_fp8_block_ref(a, sa, q, sw, b).dtype == torch.bfloat16


def read_back_as_cublas(ap: torch.Tensor, sa: torch.Tensor, cw: sm.CublasWeight) -> torch.Tensor:
    """float32 [M', N] computed from the prepared tensors the way cuBLAS indexes them."""
    m, kp = ap.shape
    kb = kp // 128
    a = ap.float() * sa.float()[:, torch.arange(kp) // 128]  # scale_a[i, k // 128]
    wt = cw.mat_b.float()  # [K', N], element (k, n)
    sb = cw.scale_b[:kb]  # [kb, nb] (rows kb..L4 are padding)
    w = wt * sb.float()[torch.arange(kp) // 128][:, torch.arange(cw.n) // 128]
    return a @ w


@pytest.mark.parametrize("m,n,k", [(1, 256, 2880), (5, 2112, 384), (3, 144, 640)])
def test_cublas_layouts(gen, m, n, k):
    a, sa, q, sw, _ = fp8_block_case(m, n, k, gen, False, "cpu")
    cw = sm.prepare_weight(q, sw)
    kp = -(-k // 128) * 128
    l4 = -(-(kp // 128) // 4) * 4
    assert cw.mat_b.shape == (kp, n) and cw.mat_b.stride() == (1, kp), "mat_b must be W.t(): [K', N] column-major"
    assert cw.scale_b.shape == (l4, -(-n // 128)) and cw.scale_b.stride() == (1, l4)
    assert torch.equal(cw.mat_b[:k].view(torch.uint8), q.t().view(torch.uint8))
    assert not cw.mat_b[k:].view(torch.uint8).any() and not cw.scale_b[kp // 128 :].any()
    ap, sa_c = sm.prepare_act(a, sa, kp)
    mp = -(-m // sm.CUBLAS_M_ALIGN) * sm.CUBLAS_M_ALIGN  # zero rows: cuBLASLt refuses M = 1
    assert ap.shape == (mp, kp) and ap.stride() == (kp, 1)
    assert not ap[m:].view(torch.uint8).any() and not ap[:, k:].view(torch.uint8).any()
    assert sa_c.shape == (mp, kp // 128) and sa_c.stride() == (1, mp), "scale_a must be column-major"
    assert torch.equal(sa_c[:m], sa) and not sa_c[m:].any()
    want = gemm_fp8_block_ref(a, sa, q, sw, None, torch.float32)
    got = read_back_as_cublas(ap, sa_c, cw)
    assert not got[m:].any(), "padded rows give zeros, cut off after the call"
    assert_gemm_close(got[:m], want, "cuBLAS layout read back", 1e-6)
    ap1, sa1 = sm.prepare_act(a, sa, kp, m_align=1)
    assert ap1.shape == (m, kp) and sa1.stride() == (1, m), "m_align=1: no row padding"


@pytest.mark.skipif(not hasattr(F, "scaled_mm"), reason="this torch has no F.scaled_mm")
@pytest.mark.parametrize("m", [1, 5, 256])
def test_meta_scaled_mm_accepts_the_layouts(gen, m):
    """torch's meta kernel checks the documented shapes/strides (its N // 128 is a floor, so N % 128 == 0 here)."""
    a, sa, q, sw, _ = fp8_block_case(m, 256, 384, gen, False, "cpu")
    cw = sm.prepare_weight(q, sw)
    ap, sa_c = sm.prepare_act(a, sa, 384)

    def meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    out = sm.scaled_mm_prepared(meta(ap), meta(sa_c), sm.CublasWeight(meta(cw.mat_b), meta(cw.scale_b), cw.n, cw.k), None, torch.bfloat16)
    assert out.shape == (ap.shape[0], 256) and out.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="stride"):  # row-major scale_a is rejected
        sm.scaled_mm_prepared(meta(ap), meta(torch.empty(ap.shape[0], 3)), sm.CublasWeight(meta(cw.mat_b), meta(cw.scale_b), cw.n, cw.k), None, torch.bfloat16)


def test_gemm_ops_are_registered():
    assert dispatch.backends("gemm_fp8_block") == ["triton", "deepgemm", "torch"]
    assert dispatch.backends("gemm_mxfp8") == ["triton", "dequant-bf16", "torch"]
    assert dispatch.which("gemm_fp8_block", "cpu") == "torch"
    assert not sm.cublas_available(torch.device("cpu")).ok


# ---- GPU ----------------------------------------------------------------------------------------


def check_fp8_backend(gen, m: int, n: int, k: int, bias: bool, backend: str, what: str) -> tuple[tuple, torch.Tensor]:
    """One random fp8-block case on CUDA through ``backend``, checked against the float32 reference;
    returns the operands and the reference."""
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, bias, "cuda")
    ref = gemm_fp8_block_ref(a, sa, q, sw, b, torch.float32)
    out = dispatch.call("gemm_fp8_block", a, sa, q, sw, b, backend=backend)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert_gemm_close(out, ref, f"{what} {m}x{n}x{k} bias={bias}", 1e-3)
    return (a, sa, q, sw, b), ref


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m,n,k", [(1, 2112, 2880), (5, 2112, 2880), (64, 2112, 7168), (1024, 2880, 2880), (1024, 4096, 7168)])
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_cublas_baseline_and_auto(gen, m, n, k, bias):
    """The benchmarks' cuBLAS baseline on prepared operands, and auto's leaf, against the float32 reference."""
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, bias, "cuda")
    ref = gemm_fp8_block_ref(a, sa, q, sw, b, torch.float32)
    cw = sm.prepare_weight(q, sw)
    ap, sa_c = sm.prepare_act(a, sa, cw.mat_b.shape[0])
    y = sm.scaled_mm_prepared(ap, sa_c, cw, b, torch.bfloat16)[:m]
    assert_gemm_close(y, ref, f"cuBLAS ({sm.api()}) {m}x{n}x{k} bias={bias}", 1e-3)
    (a, sa, q, sw, b), ref = check_fp8_backend(gen, m, n, k, bias, "auto", f"auto ({dispatch.which('gemm_fp8_block', a, sa, q, sw, b)})")
