"""cuBLAS's block-scaled FP8 GEMM (torch ``scaled_mm``): the benchmarks' baseline, not a dispatcher backend.

Layouts (torch ScaledBlas.cpp ``_scaled_block1x128_block128x128``; SM90, cuBLASLt >= 12.9): mat_a [M', K'] row-major,
mat_b [K', N] column-major (W.t(), no copy), scale_a F32 [M', K/128] column-major, scale_b F32 [L4, ceil(N/128)] with
strides (1, L4), L4 = ceil(K/128) rounded up to 4.  K' is K rounded up to 128 (zero columns); M' is M rounded up to
:data:`CUBLAS_M_ALIGN` (zero rows): cuBLASLt's heuristic refuses M = 1 on the H200.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...formats import fp8_block
from .. import dispatch
from ..dispatch import capability
from .deepgemm import mn_major_scales

BLOCK = fp8_block.BLOCK
CUBLAS_M_ALIGN = 16


def api() -> str:
    """The torch entry point this torch has."""
    return "torch.nn.functional.scaled_mm" if hasattr(F, "scaled_mm") else "torch._scaled_mm"


@dataclass(frozen=True)
class CublasWeight:
    """``mat_b`` [K', N] column-major, ``scale_b`` [L4, ceil(N/128)] strides (1, L4)."""

    mat_b: torch.Tensor
    scale_b: torch.Tensor
    n: int
    k: int  # the true K


def pad_k(t: torch.Tensor, k_pad: int) -> torch.Tensor:
    """E4M3 [..., K] with zero columns up to ``k_pad``."""
    k = t.shape[-1]
    return t if k == k_pad else F.pad(t.view(torch.uint8), (0, k_pad - k)).view(torch.float8_e4m3fn)


def prepare_weight(w: torch.Tensor, w_scale: torch.Tensor) -> CublasWeight:
    n, k = w.shape
    kb = -(-k // BLOCK)
    assert tuple(w_scale.shape) == (-(-n // BLOCK), kb), f"weight scales {tuple(w_scale.shape)} do not fit {tuple(w.shape)}"
    assert n % 16 == 0, f"cuBLAS FP8 needs N % 16 == 0, got N={n}"
    w = pad_k(w, kb * BLOCK).contiguous()  # [N, K']
    l4 = -(-kb // 4) * 4
    sb = F.pad(w_scale.to(torch.float32), (0, l4 - kb)).contiguous()  # [nb, L4]
    return CublasWeight(w.t(), sb.t(), n, k)


def prepare_act(a: torch.Tensor, a_scale: torch.Tensor, k_pad: int, m_align: int = CUBLAS_M_ALIGN) -> tuple[torch.Tensor, torch.Tensor]:
    """(row-major [M', K'], column-major scales [M', kb]); the output's first M rows are the result."""
    m, k = a.shape
    m_pad = -(-m // m_align) * m_align
    if k_pad != k or m_pad != m:
        a = F.pad(a.view(torch.uint8), (0, k_pad - k, 0, m_pad - m)).view(torch.float8_e4m3fn)
    return a.contiguous(), mn_major_scales(a_scale, m_pad).t()


def scaled_mm_prepared(a: torch.Tensor, sa: torch.Tensor, cw: CublasWeight, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """One cuBLAS call -> out_dtype [M', N] (bias in cuBLAS's epilogue)."""
    if hasattr(F, "scaled_mm"):
        return F.scaled_mm(
            a, cw.mat_b, sa, F.ScalingType.BlockWise1x128, cw.scale_b, F.ScalingType.BlockWise128x128,
            bias=bias, output_dtype=out_dtype,
        )  # fmt: skip
    return torch._scaled_mm(a, cw.mat_b, sa, cw.scale_b, bias=bias, out_dtype=out_dtype)


def cublas_available(device: torch.device) -> dispatch.Availability:
    if device.type != "cuda":
        return dispatch.Availability(False, reason=f"cuBLAS needs a CUDA device, got {device.type}")
    major, minor = capability(device)
    if major != 9:
        return dispatch.Availability(False, reason=f"block-wise (1x128, 128x128) scaled_mm is SM90-only in torch, got sm_{major}{minor}")
    return dispatch.Availability(True)
