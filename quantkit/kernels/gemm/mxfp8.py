"""The ``gemm_mxfp8`` op's leaves on Hopper, which has no MX tensor cores: y = dequant(A) @ dequant(W).T (+ bias).

A E4M3 [M, K] + U8 E8M0 [M, K/32], W E4M3 [N, K] + U8 E8M0 [N, K/32], K % 32 == 0, float32 products.

* ``triton.*`` (:func:`gemm_mxfp8`): the block-scaled kernels with 32-column sub-blocks, promoted per 32 columns or
  (``upcast``) on tiles times their power-of-two scales in bf16, exact, one bf16 dot per 128 columns.
* ``dequant-bf16`` (:func:`gemm_mxfp8_bf16`): both operands dequantized to bf16 -- exact, an E4M3 value times 2**k has
  4 significant bits, which bf16 holds for every result >= 2**-130 -- and one cuBLAS bf16 GEMM with float32 output.  It
  reads the weight three times and holds a bf16 copy of it for the call, so it pays at large M only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import mxfp8
from .block_scaled import INT32_LIMIT, Side, Workspace
from .fp8_block import KernelConfig, flatten_act, matmul
from ..triton_numerics import cdiv, e8m0_decode

MX = mxfp8.BLOCK  # 32


def _mx_scales(s: torch.Tensor) -> torch.Tensor:
    """E8M0 scales as stored (U8 or float8_e8m0fnu) -> U8."""
    assert s.dtype in (torch.uint8, torch.float8_e8m0fnu), f"E8M0 scales must be U8 or F8_E8M0, got {s.dtype}"
    return s.view(torch.uint8)


def _check_k(a: torch.Tensor) -> None:
    if a.shape[-1] % MX:
        raise ValueError(f"MXFP8 needs K to be a multiple of {MX}, got {a.shape[-1]}")


def mx_side(q: torch.Tensor, s: torch.Tensor) -> Side:
    return Side(q, _mx_scales(s), 1, MX)


def gemm_mxfp8(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: KernelConfig,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """A E4M3 [..., K] + U8 [..., K/32] x W E4M3 [N, K] + U8 [N, K/32] -> out_dtype [..., N]."""
    _check_k(a)
    return matmul(a, a_scale, mx_side, mx_side(w, w_scale), bias, out_dtype, config, workspace, False)


@triton.jit
def _mx_to_bf16_kernel(q_ptr, s_ptr, out_ptr, n_el, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """out = E4M3 q * 2**(s - 127) over a flat contiguous [R, K] with U8 scales [R, K/32]."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_el
    q = tl.load(q_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = e8m0_decode(tl.load(s_ptr + offs // 32, mask=mask, other=127).to(tl.int32))
    tl.store(out_ptr + offs, (q * s).to(OUT_DTYPE), mask=mask)


def mx_to_bf16(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """E4M3 [R, K] + U8 E8M0 [R, K/32] -> bf16 [R, K], exact (module docstring)."""
    assert q.dtype == torch.float8_e4m3fn and q.is_contiguous(), f"E4M3 contiguous rows needed, got {q.dtype} strides {q.stride()}"
    s = _mx_scales(scale).contiguous()
    assert q.shape[-1] % MX == 0 and tuple(s.shape) == (*q.shape[:-1], q.shape[-1] // MX), f"scales {tuple(s.shape)} do not fit {tuple(q.shape)}"
    assert q.numel() < INT32_LIMIT, f"{q.numel()} elements overflow 32-bit offsets"
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)  # [R, K]
    block = 2048
    # the CPU interpreter stores bf16 by truncation: exact here too, every product is a bf16 value
    _mx_to_bf16_kernel[(cdiv(q.numel(), block),)](q, s, out, q.numel(), OUT_DTYPE=tl.bfloat16, BLOCK=block, num_warps=8)
    return out


def _mm_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 x [M, K] @ w [N, K].T of exact bf16 operands: cuBLAS with float32 output on CUDA, else a float32 matmul."""
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return x.float() @ w.float().t()


def gemm_mxfp8_bf16(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """The MX function through exact bf16 dequantization and one float32-output bf16 GEMM."""
    _check_k(a)
    a2, s2 = flatten_act(a, a_scale)
    y = _mm_f32(mx_to_bf16(a2.contiguous(), s2), mx_to_bf16(w, w_scale))  # [M, N] f32
    if bias is not None:
        y += bias.to(torch.float32)
    return y.to(out_dtype).reshape(*a.shape[:-1], w.shape[0])
