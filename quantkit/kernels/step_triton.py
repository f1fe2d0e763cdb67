"""Triton backends of the decoder-layer ops of :mod:`.step_ref` (``rope_rotate``, ``add_rmsnorm``): one launch
each where the torch path launches many small kernels (RoPE: slices, four products, a difference, a sum
and a concatenation per tensor; residual add + RMSNorm: the add, casts, a square, a mean, an rsqrt and
two products).  In a CUDA-graph decode step of a few tokens every launch costs about as much as its work.

Numerics, bit for bit with the references: every float32 step an IEEE operation in the reference's order
(launched with ``enable_fp_fusion=False``: no FMA contraction), each bfloat16 op rounded from the float32
bits (:func:`.triton_numerics.bf16_round`); RMSNorm's sum of squares in the specified lane order of
:mod:`.fused_act_quant_ref` (its pass 1 is ``_rmsnorm_quant_kernel``'s).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import dispatch
from . import step_ref as ref
from .fused_act_quant import LANES, _rows, pair_sum
from .fused_act_quant_ref import SUMSQ_LANES, f32
from .triton_numerics import PRIORITY, available, bf16_round, cdiv, next_pow2


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, o_ptr, H, stride_t, stride_h, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr, ROUND: tl.constexpr):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_D)
    mask = (h < H)[:, None] & (j < HALF)[None, :]
    row = x_ptr + t * stride_t + h[:, None].to(tl.int64) * stride_h
    if INTERLEAVED:
        x1 = tl.load(row + 2 * j[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + 2 * j[None, :] + 1, mask=mask, other=0.0).to(tl.float32)
    else:
        x1 = tl.load(row + j[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(row + HALF + j[None, :], mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t * HALF + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * HALF + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
    lo = bf16_round(bf16_round(x1 * c, ROUND) - bf16_round(x2 * s, ROUND), ROUND)
    hi = bf16_round(bf16_round(x2 * c, ROUND) + bf16_round(x1 * s, ROUND), ROUND)
    out = o_ptr + t * H * (2 * HALF) + h[:, None].to(tl.int64) * (2 * HALF) + j[None, :]
    tl.store(out, lo.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(out + HALF, hi.to(o_ptr.dtype.element_ty), mask=mask)


@dispatch.backend("rope_rotate", "triton", available=available, priority=PRIORITY)
def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "half", *, block_h: int = 16,
                num_warps: int = 4) -> torch.Tensor:  # fmt: skip
    """:func:`.step_ref.rope_rotate` in one launch; ``block_h`` heads per program (the bytes do not change)."""
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


@triton.jit(do_not_specialize=["k_f32", "eps"])
def _add_rmsnorm_kernel(x_ptr, y_ptr, w_ptr, s_ptr, o_ptr, M, K, stride_x, stride_y, k_f32, eps, BLOCK_M: tl.constexpr,
                        UNROLL: tl.constexpr, BLOCK_K: tl.constexpr, ROUND: tl.constexpr, ROUND_H: tl.constexpr):  # fmt: skip
    row0 = tl.program_id(0).to(tl.int64) * BLOCK_M
    r = tl.arange(0, BLOCK_M)
    rmask = r < M - row0
    rows = row0 + r
    lane = tl.arange(0, LANES)
    acc = tl.zeros([BLOCK_M, LANES], tl.float32)
    for k0 in range(0, K, LANES * UNROLL):  # pass 1: s = x + y (written out), lane j adds s[j]**2, s[j+128]**2, ... in order
        for u in tl.static_range(UNROLL):
            cols = k0 + u * LANES + lane
            mask = rmask[:, None] & (cols < K)[None, :]
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            s = bf16_round(x + y, ROUND)
            tl.store(s_ptr + rows[:, None] * K + cols[None, :], s.to(s_ptr.dtype.element_ty), mask=mask)
            acc = acc + s * s
    mean = tl.math.div_rn(pair_sum(acc, BLOCK_M), k_f32)
    rstd = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), tl.sqrt_rn(mean + eps))[:, None]
    wide = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):  # pass 2, elementwise: s again from x and y (no read of what other threads wrote), normalised
        cols = k0 + wide
        mask = rmask[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)[None, :]
        h = bf16_round(bf16_round(x + y, ROUND) * rstd, ROUND_H)  # order "hf": h.to(bfloat16) before the weight
        tl.store(o_ptr + rows[:, None] * K + cols[None, :], bf16_round(w * h, ROUND).to(o_ptr.dtype.element_ty), mask=mask)


@dispatch.backend("add_rmsnorm", "triton", available=available, priority=PRIORITY)
def add_rmsnorm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *, block_m: int = 1,
                unroll: int = 8, block_k: int = 1024, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`.step_ref.add_rmsnorm` in one launch; ``block_m`` rows per program, ``unroll`` 128-chunks per pass-1
    step, ``block_k`` columns per pass-2 step (none changes the bytes).  A row is walked by one program: few, wide
    steps (a 2880-wide row in 3 + 3 rather than 6 + 23 of 128, which took 15.6 us a launch on the H200)."""
    ref.check_add_norm(x, y, weight, order)
    k = x.shape[-1]
    x2, y2 = _rows(x), _rows(y)
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    m = x2.shape[0]
    if m and k:
        block_m = min(block_m, next_pow2(m))
        bf16 = x.dtype == torch.bfloat16
        _add_rmsnorm_kernel[(cdiv(m, block_m),)](
            x2, y2, weight.contiguous(), s, out, m, k, x2.stride(0), y2.stride(0), float(k), f32(eps),
            BLOCK_M=block_m, UNROLL=unroll, BLOCK_K=min(block_k, max(next_pow2(k), SUMSQ_LANES)), ROUND=bf16, ROUND_H=bf16 and order == "hf",
            num_warps=num_warps,
            enable_fp_fusion=False,
        )  # fmt: skip
    return s, out
