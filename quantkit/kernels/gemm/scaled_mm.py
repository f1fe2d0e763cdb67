"""The GEMM ops: their torch references, the cuBLAS backend (torch's block-scaled ``scaled_mm``),
and their registration with the dispatcher (the Triton backends live in :mod:`.gemm_fp8_block`
and :mod:`.gemm_mxfp8`).

| op                  | a (tokens)                              | w (weight)                                        |
|---------------------|-----------------------------------------|---------------------------------------------------|
| ``gemm_fp8_block``  | E4M3 [..., K] + F32 [..., ceil(K/128)]  | E4M3 [N, K] + F32 [ceil(N/128), ceil(K/128)]      |
| ``gemm_mxfp8``      | E4M3 [..., K] + U8 E8M0 [..., K/32]     | E4M3 [N, K] + U8 E8M0 [N, K/32]                   |
| ``gemm_mxfp8_w128`` | E4M3 [..., K] + U8 E8M0 [..., K/32]     | E4M3 [N, K] + power-of-two F32 [ceil(N/128), ceil(K/128)] |

All take ``(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16)`` and return
out_dtype [..., N] = dequant(a) @ dequant(w).T + bias, computed in float32 and rounded once.

cuBLAS (torch ScaledBlas.cpp ``_scaled_block1x128_block128x128``; SM90 only, cuBLASLt >= 12.9):
mat_a [M, K] row-major, mat_b [K, N] column-major (W.t(), no copy), scale_a F32 [M, K/128]
column-major (strides (1, M)), scale_b F32 [L4, ceil(N/128)] with strides (1, L4), L4 =
ceil(K/128) rounded up to 4.  K must be a multiple of 128: a weight with K = 2880 is
zero-padded to 2944 at :func:`prepare_weight` and the activation is padded per call.  M is
padded with zero rows to a multiple of :data:`CUBLAS_M_ALIGN`: on the H200 (torch 2.11, CUDA 13.0)
cuBLASLt's heuristic answers CUBLAS_STATUS_NOT_SUPPORTED at M = 1 and runs M = 16, 64, ...
(``scripts/bench_kernels.py`` probes which M it accepts and prints it).  Called through
``torch.nn.functional.scaled_mm`` (ScalingType.BlockWise1x128 / BlockWise128x128) when torch
has it, else ``torch._scaled_mm`` with the same tensors; :func:`api` says which.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...formats import fp8_block, mxfp8
from .. import dispatch
from ..dispatch import capability

BLOCK = fp8_block.BLOCK
CUBLAS_PRIORITY = 5  # explicit, or through "by-shape"; it re-lays out scales on every call
BY_SHAPE_PRIORITY = 20
CUBLAS_M_ALIGN = 16  # rows of mat_a are zero-padded to a multiple of this (M = 1 is refused)
INT32_LIMIT = 2**31
# by-shape for gemm_fp8_block: (largest M, backend), first match wins; N % 16 != 0 always runs
# Triton.  H200 runs (torch 2.11, triton 3.6; docs/benchmarks.md), CUDA graphs: Triton at every M.
# Ninth pass (clean L2), against cuBLAS on prepared operands: at M <= 16 the small-M kernel is 1.02-1.87x
# on all 14 shapes (geomean 1.29-1.42x), at M = 24 / 32 it wins 9 / 8 of 14 (0.83-1.62x, geomean 1.19 /
# 1.13x); this backend's cuBLAS call is slower than the prepared one (it re-lays out the scales, and pads
# K % 128 != 0, every time), and at M = 64 the table's kernel (wgmma from M = 33) beat it on 13 of 14
# shapes (DeepSeek-V3 o 1.02x the other way).  Until then M = 17-64 ran cuBLAS.
# From M = 65 the warp-specialised kernel matches cuBLAS on prepared operands (0.93-1.03x geomean at
# M = 128-8192) and beats the per-call cuBLAS 1.56-1.70x at M = 128-512, 1.23x geomean at M = 1024-8192
# (seventh pass).  Where the Gluon kernel cannot run, Triton's tiled fallback runs instead (0.66-0.76x
# prepared cuBLAS; not timed against this backend's per-call cuBLAS).
# Sixteenth pass: DeepGEMM (FlashInfer's copy, :mod:`.deepgemm`) against the Triton op on prepared operands,
# graph times over the 14 shapes: faster on 0 / 2 / 9 / 14 / 13 / 11 / 9 / 4 of 14 at M = 1 / 16 / 32 / 64 /
# 128 / 256 / 512 / 1024 (geomean 0.59 / 0.74 / 1.07 / 1.57 / 1.39 / 1.20 / 1.04 / 0.96x).  Through by-shape
# it pays one more launch (the activation scales transposed to MN-major), and from M = 65 the Triton op's
# narrow-tile row (same pass) runs at 0.92 / 0.94x DeepGEMM's prepared speed at M = 128 / 256, above what
# by-shape got from DeepGEMM there (1.28 against 1.14x cuBLAS at M = 128), so by-shape runs it at
# M = 33-64 only, where it can (the headers, nvcc, sm_90, N % 8 == 0), K % 128 == 0 (a K that needs padding
# would copy the weight per call) and K >= 1024 (DeepSeek-V3 kv_b, K = 512, lost: 0.93x): 1.08-1.54x the
# Triton op at M = 64 on the 11 shapes it takes.
# Seventeenth pass: the quantizers write the scales MN-major (``scale_mn``, the engine's layout on GPUs), so
# DeepGEMM reads them with no extra launch (by-shape's time is 0.93-1.05x DeepGEMM's own at M = 48-64), and
# TMA zero-fills a K that is not a multiple of 128 (no padded copy).  Graph times over the 14 shapes,
# DeepGEMM against the Triton op: faster on 2 / 8 / 9 / 14 / 14 / 12 of 14 at M = 16 / 24 / 32 / 48 / 64 /
# 128 (geomean time 1.37 / 1.08 / 0.96 / 0.68 / 0.65 / 0.93x); at M = 24-32 it wins where K <= 4096 and loses
# on the longer K (the small-M kernel splits K over every SM), from M = 65 it loses on K = 512 (kv_b).
BY_SHAPE_FP8: tuple[tuple[int, str], ...] = ((24, "triton"), (512, "deepgemm"), (INT32_LIMIT, "triton"))


def deepgemm_pays(m: int, k: int) -> bool:
    """Within the deepgemm rows: at M <= 32 only where K <= 4096, from M = 65 only where K >= 1024."""
    return k <= 4096 if m <= 32 else k >= 1024 if m > 64 else True


def _finish(y: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype, lead: tuple[int, ...]) -> torch.Tensor:
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype).reshape(*lead, y.shape[-1])


def gemm_fp8_block_ref(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """DeepSeek's numerics: dequantize both sides (F32), one F32 matmul, one rounding."""
    x = fp8_block.dequantize_act(a, a_scale).reshape(-1, a.shape[-1])
    y = x @ fp8_block.dequantize_weight(w, w_scale).T
    return _finish(y, bias, out_dtype, a.shape[:-1])


def gemm_mxfp8_ref(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    x = mxfp8.dequantize(a, a_scale.view(torch.uint8)).reshape(-1, a.shape[-1])
    y = x @ mxfp8.dequantize(w, w_scale.view(torch.uint8)).T
    return _finish(y, bias, out_dtype, a.shape[:-1])


def gemm_mxfp8_w128_ref(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    x = mxfp8.dequantize(a, a_scale.view(torch.uint8)).reshape(-1, a.shape[-1])
    y = x @ fp8_block.dequantize_weight(w, w_scale).T
    return _finish(y, bias, out_dtype, a.shape[:-1])


def api() -> str:
    """Which torch entry point the cuBLAS backend calls on this torch."""
    return "torch.nn.functional.scaled_mm" if hasattr(F, "scaled_mm") else "torch._scaled_mm"


@dataclass(frozen=True)
class CublasWeight:
    """A weight in cuBLAS's layout: ``mat_b`` [K', N] column-major, ``scale_b`` [L4, ceil(N/128)] strides (1, L4)."""

    mat_b: torch.Tensor
    scale_b: torch.Tensor
    n: int
    k: int  # the true K; mat_b has K' = K rounded up to 128 (zero columns)


def pad_k(t: torch.Tensor, k_pad: int) -> torch.Tensor:
    """E4M3 [..., K] with zero columns up to ``k_pad`` (the tensor itself when K == k_pad)."""
    k = t.shape[-1]
    return t if k == k_pad else F.pad(t.view(torch.uint8), (0, k_pad - k)).view(torch.float8_e4m3fn)


def mn_major_scales(a_scale: torch.Tensor, rows: int) -> torch.Tensor:
    """F32 [M, kb] activation scales -> contiguous [kb, rows] (rows >= M, the extra columns zero):
    the MN-major layout cuBLAS (as its transpose) and DeepGEMM read.  Scales a quantizer wrote MN-major
    (``scale_mn``) with that many columns are returned as their own buffer, no copy."""
    base = fp8_block.mn_major_storage(a_scale)
    if base is not None and base.shape[1] == rows:
        return base
    return fp8_block.mn_major_copy(a_scale, rows)


def prepare_weight(w: torch.Tensor, w_scale: torch.Tensor) -> CublasWeight:
    """W E4M3 [N, K] + F32 [ceil(N/128), ceil(K/128)] -> cuBLAS layout (copies only when K % 128 != 0)."""
    n, k = w.shape
    kb = -(-k // BLOCK)
    assert tuple(w_scale.shape) == (-(-n // BLOCK), kb), f"weight scales {tuple(w_scale.shape)} do not fit {tuple(w.shape)}"
    assert n % 16 == 0, f"cuBLAS FP8 needs N % 16 == 0, got N={n}"
    w = pad_k(w, kb * BLOCK).contiguous()  # [N, K'] zero columns
    l4 = -(-kb // 4) * 4
    sb = F.pad(w_scale.to(torch.float32), (0, l4 - kb)).contiguous()  # [nb, L4]
    return CublasWeight(w.t(), sb.t(), n, k)


def prepare_act(a: torch.Tensor, a_scale: torch.Tensor, k_pad: int, m_align: int = CUBLAS_M_ALIGN) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] E4M3 + F32 [M, ceil(K/128)] -> (row-major [M', K'] zero-padded, column-major scales
    [M', kb] with zero rows), M' = M rounded up to ``m_align``; the output's first M rows are the result."""
    m, k = a.shape
    m_pad = -(-m // m_align) * m_align
    if k_pad != k or m_pad != m:
        a = F.pad(a.view(torch.uint8), (0, k_pad - k, 0, m_pad - m)).view(torch.float8_e4m3fn)
    return a.contiguous(), mn_major_scales(a_scale, m_pad).t()  # [M', kb] col-major


def scaled_mm_prepared(a: torch.Tensor, sa: torch.Tensor, cw: CublasWeight, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """One cuBLAS call on prepared operands -> out_dtype [M, N] (bias in cuBLAS's epilogue)."""
    if hasattr(F, "scaled_mm"):
        return F.scaled_mm(
            a, cw.mat_b, sa, F.ScalingType.BlockWise1x128, cw.scale_b, F.ScalingType.BlockWise128x128,
            bias=bias, output_dtype=out_dtype,
        )  # fmt: skip
    return torch._scaled_mm(a, cw.mat_b, sa, cw.scale_b, bias=bias, out_dtype=out_dtype)


def gemm_fp8_block_cublas(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """The op through cuBLAS; lays out the scales (and pads K) on every call: serving code keeps a
    :class:`CublasWeight` from :func:`prepare_weight` and calls :func:`scaled_mm_prepared`."""
    cw = prepare_weight(w, w_scale)
    a2, s2 = a.reshape(-1, a.shape[-1]), a_scale.reshape(-1, a_scale.shape[-1])
    ap, sa = prepare_act(a2, s2, cw.mat_b.shape[0])
    epilogue_bias = bias is not None and bias.dtype == out_dtype == torch.bfloat16  # cuBLAS adds it in f32
    y = scaled_mm_prepared(ap, sa, cw, bias if epilogue_bias else None, out_dtype)[: a2.shape[0]]
    if bias is not None and not epilogue_bias:  # a second rounding: within one ulp of the reference
        y = (y.to(torch.float32) + bias.to(torch.float32)).to(out_dtype)
    return y.reshape(*a.shape[:-1], cw.n)


def by_shape_choice(m: int, n: int, k: int, device: torch.device | None = None) -> str:
    """The backend ``by-shape`` runs for an [m, k] x [n, k] fp8-block GEMM (:data:`BY_SHAPE_FP8`);
    a "deepgemm" row runs Triton where DeepGEMM cannot or did not pay (no device given, not available,
    N % 8, K % 16, :func:`deepgemm_pays`)."""
    choice = next(b for m_max, b in BY_SHAPE_FP8 if m <= m_max)
    if choice == "deepgemm":
        from . import deepgemm

        ok = device is not None and n % 8 == 0 and k % 16 == 0 and deepgemm_pays(m, k) and deepgemm.available_cached(device).ok
        return "deepgemm" if ok else "triton"
    if n % 16:
        return "triton"  # cuBLAS FP8 needs N % 16 == 0
    return choice


def deepgemm_jobs(shapes: Iterable[tuple[int, int]], device: torch.device) -> set[tuple[int, int, object]]:
    """The DeepGEMM kernels by-shape builds for [N, K] weights on ``device`` at every M it sends to DeepGEMM:
    (N, K, config) for :func:`.deepgemm.prebuild` (empty where DeepGEMM is not available)."""
    from . import deepgemm

    jobs: set[tuple[int, int, object]] = set()
    top = max(m_max for m_max, b in BY_SHAPE_FP8 if b == "deepgemm")
    for n, k in set(shapes):
        for m in range(1, top + 1):
            if by_shape_choice(m, n, k, device) == "deepgemm":
                jobs.add((n, k, deepgemm.launch_config(m, n, k, device)))
    return jobs


def cublas_available(device: torch.device) -> dispatch.Availability:
    if device.type != "cuda":
        return dispatch.Availability(False, reason=f"cuBLAS needs a CUDA device, got {device.type}")
    major, minor = capability(device)
    if major != 9:
        return dispatch.Availability(False, reason=f"block-wise (1x128, 128x128) scaled_mm is SM90-only in torch, got sm_{major}{minor}")
    return dispatch.Availability(True, auto=False, reason="explicit only: re-lays out scales per call")


def _register() -> None:
    for op, fn in (("gemm_fp8_block", gemm_fp8_block_ref), ("gemm_mxfp8", gemm_mxfp8_ref), ("gemm_mxfp8_w128", gemm_mxfp8_w128_ref)):
        dispatch.register(op, dispatch.REFERENCE, fn)
    dispatch.register("gemm_fp8_block", "cublas", gemm_fp8_block_cublas, available=cublas_available, priority=CUBLAS_PRIORITY)


_register()
