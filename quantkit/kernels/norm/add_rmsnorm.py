"""Triton :mod:`.add_rmsnorm_ref`: the residual add and RMSNorm in one launch instead of about ten, bit for bit (IEEE
float32 steps in the reference's order, no FMA; bfloat16 rounded from the float32 bits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..quant.fused_act_quant import LANES, _rows, pair_sum
from ..quant.fused_act_quant_ref import SUMSQ_LANES, f32
from ..triton_numerics import PRIORITY, available, bf16_round, cdiv, next_pow2
from . import add_rmsnorm_ref as ref


@triton.jit(do_not_specialize=["k_f32", "eps"])
def _add_rmsnorm_kernel(x_ptr, y_ptr, w_ptr, s_ptr, o_ptr, M, K, stride_x, stride_y, k_f32, eps, BLOCK_M: tl.constexpr,
                        UNROLL: tl.constexpr, BLOCK_K: tl.constexpr, ROUND: tl.constexpr, ROUND_H: tl.constexpr):  # fmt: skip
    row0 = tl.program_id(0).to(tl.int64) * BLOCK_M
    r = tl.arange(0, BLOCK_M)
    rmask = r < M - row0
    rows = row0 + r
    lane = tl.arange(0, LANES)
    acc = tl.zeros([BLOCK_M, LANES], tl.float32)
    for k0 in range(0, K, LANES * UNROLL):  # pass 1: store s, sum its squares
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
    for k0 in range(0, K, BLOCK_K):  # pass 2 recomputes s: other threads stored it
        cols = k0 + wide
        mask = rmask[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)[None, :]
        h = bf16_round(bf16_round(x + y, ROUND) * rstd, ROUND_H)
        tl.store(o_ptr + rows[:, None] * K + cols[None, :], bf16_round(w * h, ROUND).to(o_ptr.dtype.element_ty), mask=mask)


@dispatch.backend("add_rmsnorm", "triton", available=available, priority=PRIORITY)
def add_rmsnorm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *, block_m: int = 1,
                unroll: int | None = None, block_k: int = 4096, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`.add_rmsnorm_ref.add_rmsnorm` in one launch.  Each step waits for its loads, so a program walks its rows
    in as few steps as registers allow (``unroll`` 128-chunks, ``block_k`` columns)."""
    ref.check_add_norm(x, y, weight, order)
    k = x.shape[-1]
    x2, y2 = _rows(x), _rows(y)
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    m = x2.shape[0]
    if m and k:
        block_m = min(block_m, next_pow2(m))
        unroll = unroll or min(32, cdiv(k, LANES))
        bf16 = x.dtype == torch.bfloat16
        _add_rmsnorm_kernel[(cdiv(m, block_m),)](
            x2, y2, weight.contiguous(), s, out, m, k, x2.stride(0), y2.stride(0), float(k), f32(eps),
            BLOCK_M=block_m, UNROLL=unroll, BLOCK_K=min(block_k, max(next_pow2(k), SUMSQ_LANES)), ROUND=bf16, ROUND_H=bf16 and order == "hf",
            num_warps=num_warps,
            enable_fp_fusion=False,
        )  # fmt: skip
    return s, out
