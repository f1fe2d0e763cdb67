"""Triton ``rope_rotate`` and ``rope_cache_write`` (:mod:`.rope_ref`), one launch each, bit for bit: float32 steps in
the reference's order without FMA contraction, each bfloat16 op rounded from float32 (:func:`bf16_round`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..triton_numerics import PRIORITY, available, bf16_round, cdiv, next_pow2
from . import rope_ref as ref


@triton.jit
def _rotate(row, j, mask, c, s, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, ROUND: tl.constexpr):
    """(lo, hi) halves of the rotated heads at ``row`` [BH, 1] pointers."""
    if INTERLEAVED:
        x1 = tl.load(row + 2 * j[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + 2 * j[None, :] + 1, mask=mask, other=0.0).to(tl.float32)
    else:
        x1 = tl.load(row + j[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + HALF + j[None, :], mask=mask, other=0.0).to(tl.float32)
    lo = bf16_round(bf16_round(x1 * c, ROUND) - bf16_round(x2 * s, ROUND), ROUND)
    hi = bf16_round(bf16_round(x2 * c, ROUND) + bf16_round(x1 * s, ROUND), ROUND)
    return lo, hi


@triton.jit
def _table(cos_ptr, sin_ptr, t, j, HALF: tl.constexpr):
    c = tl.load(cos_ptr + t * HALF + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * HALF + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
    return c, s


@triton.jit
def _rotate_into(src, dst, j, mask, cos_ptr, sin_ptr, t, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, ROUND: tl.constexpr):
    """Token t's heads at ``src`` rotated into ``dst`` ([BH, 1] pointers)."""
    c, s = _table(cos_ptr, sin_ptr, t, j, HALF)
    lo, hi = _rotate(src, j, mask, c, s, HALF, INTERLEAVED, ROUND)
    tl.store(dst + j[None, :], lo.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + j[None, :], hi.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, o_ptr, H, stride_t, stride_h, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr, ROUND: tl.constexpr):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_D)
    mask = (h < H)[:, None] & (j < HALF)[None, :]
    _rotate_into(x_ptr + t * stride_t + h[:, None].to(tl.int64) * stride_h, o_ptr + t * H * (2 * HALF) + h[:, None].to(tl.int64) * (2 * HALF),
                 j, mask, cos_ptr, sin_ptr, t, HALF, INTERLEAVED, ROUND)  # fmt: skip


@dispatch.backend("rope_rotate", "triton", available=available, priority=PRIORITY)
def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "half", *, block_h: int = 16,
                num_warps: int = 4) -> torch.Tensor:  # fmt: skip
    """:func:`.rope_ref.rope_rotate`; ``block_h`` heads per program."""
    ref.check_rope(x, cos, sin, style)
    t, h, d = x.shape
    assert x.stride(2) == 1, f"rope_rotate: x needs unit stride along D, got strides {x.stride()}"
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    if t and h:
        block_h = min(block_h, next_pow2(h))
        _rope_kernel[(t, cdiv(h, block_h))](
            x, cos.contiguous(), sin.contiguous(), out, h, x.stride(0), x.stride(1), HALF=d // 2, BLOCK_H=block_h,
            BLOCK_D=next_pow2(d // 2), INTERLEAVED=style == "interleaved", ROUND=x.dtype == torch.bfloat16,
            num_warps=num_warps, enable_fp_fusion=False,
        )  # fmt: skip
    return out


@triton.jit
def _rope_cache_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slot_ptr, qo_ptr, kc_ptr, vc_ptr, HQ, HKV, NQ, NK,
                       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                       INTERLEAVED: tl.constexpr, ROUND: tl.constexpr):  # fmt: skip
    """Token t, one BLOCK_H-head tile of q (rotated into qo), k (rotated into k_cache[slot]) or v (into v_cache[slot])."""
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    j = tl.arange(0, BLOCK_D)
    hh = tl.arange(0, BLOCK_H)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    d = 2 * HALF
    if p < NQ:  # a name bound in several branches must have one type when compiled: each branch has its own
        hq = (p * BLOCK_H + hh)[:, None]
        _rotate_into(q_ptr + t * sq_t + hq.to(tl.int64) * sq_h, qo_ptr + t * HQ * d + hq.to(tl.int64) * d, j,
                     (hq < HQ) & (j < HALF)[None, :], cos_ptr, sin_ptr, t, HALF, INTERLEAVED, ROUND)  # fmt: skip
    elif p < NQ + NK:
        hk = ((p - NQ) * BLOCK_H + hh)[:, None]
        _rotate_into(k_ptr + t * sk_t + hk.to(tl.int64) * sk_h, kc_ptr + slot * HKV * d + hk.to(tl.int64) * d, j,
                     (hk < HKV) & (j < HALF)[None, :], cos_ptr, sin_ptr, t, HALF, INTERLEAVED, ROUND)  # fmt: skip
    else:
        hv = (p - NQ - NK) * BLOCK_H + hh
        mask = (hv < HKV)[:, None] & (j < HALF)[None, :]
        src = v_ptr + t * sv_t + hv[:, None].to(tl.int64) * sv_h + j[None, :]
        out = vc_ptr + slot * HKV * d + hv[:, None].to(tl.int64) * d + j[None, :]
        tl.store(out, tl.load(src, mask=mask, other=0.0).to(vc_ptr.dtype.element_ty), mask=mask)
        tl.store(out + HALF, tl.load(src + HALF, mask=mask, other=0.0).to(vc_ptr.dtype.element_ty), mask=mask)


@dispatch.backend("rope_cache_write", "triton", available=available, priority=PRIORITY)
def rope_cache_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str,
                     slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, block_h: int = 16,
                     num_warps: int = 4) -> torch.Tensor:  # fmt: skip
    """:func:`.rope_ref.rope_cache_write`; q, k, v may be strided views of one GEMM output."""
    ref.check_rope(q, cos, sin, style)
    ref.check_rope(k, cos, sin, style)
    ref.check_rope_cache(q, k, v, slots, k_cache, v_cache)
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1, "rope_cache_write: q, k and v need unit stride along D"
    t, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t:
        block_h = min(block_h, next_pow2(max(hq, hkv)))
        nq, nk = cdiv(hq, block_h), cdiv(hkv, block_h)
        _rope_cache_kernel[(t, nq + 2 * nk)](
            q, k, v, cos.contiguous(), sin.contiguous(), slots, out, k_cache, v_cache, hq, hkv, nq, nk,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), HALF=d // 2, BLOCK_H=block_h,
            BLOCK_D=next_pow2(d // 2), INTERLEAVED=style == "interleaved", ROUND=q.dtype == torch.bfloat16,
            num_warps=num_warps, enable_fp_fusion=False,
        )  # fmt: skip
    return out
