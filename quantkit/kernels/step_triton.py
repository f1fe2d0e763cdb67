"""Triton backends of the decoder-layer ops of :mod:`.step_ref` (``rope_rotate``, ``rope_cache_write``,
``add_rmsnorm``, ``router_topk``): one launch each where the torch path launches many small kernels (RoPE:
slices, four products, a difference, a sum and a concatenation per tensor, then an index write per cache;
residual add + RMSNorm: the add, casts, a square, a mean, an rsqrt and two products; a router: a cast, a
float32 GEMV and its reduction, a top-k, a sort and a softmax).  In a CUDA-graph decode step of a few tokens
every launch costs about as much as its work.

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
from .gemm_block_scaled import WORKSPACE, split_reduce
from .fused_act_quant_ref import SUMSQ_LANES, f32
from .triton_numerics import PRIORITY, available, bf16_round, cdiv, next_pow2


@triton.jit
def _rotate(row, j, mask, c, s, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, ROUND: tl.constexpr):
    """(lo, hi) halves of the rotated heads at ``row`` [BH, 1] pointers (step_ref.rope_rotate's roundings)."""
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
    """Token t's heads at ``src`` rotated into ``dst`` (both [BH, 1] pointers to each head's first element)."""
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
                unroll: int | None = None, block_k: int = 4096, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`.step_ref.add_rmsnorm` in one launch; ``block_m`` rows per program, ``unroll`` 128-chunks per pass-1
    step (default: the whole row, up to 32), ``block_k`` columns per pass-2 step (none changes the bytes).  A row is
    walked by one program, in as few steps as its registers allow: each step waits for its loads (H200, C = 1, a
    2880-wide row: 6 + 23 steps of 128 took 15.6 us a launch, 3 + 3 wide steps 8.3 us)."""
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
    # each branch names its own head index: compiled Triton needs a name bound in several branches to have one type
    if p < NQ:
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
    """:func:`.step_ref.rope_cache_write` in one launch (q, k and v read in place: strided views of one GEMM output)."""
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


@triton.jit
def _router_kernel(x_ptr, w_ptr, b_ptr, wo_ptr, io_ptr, part_ptr, count_ptr, T, E, K, K_SPLIT, stride_x, TOP_K: tl.constexpr,
                   TOP_KP: tl.constexpr, SOFTMAX_FIRST: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """BLOCK_T tokens x one K_SPLIT-column slice: float32 partial logits over every expert (products of exactly
    upcast values, summed in float32); the last slice to arrive sums the slices in order (split_reduce), then
    takes the rule's top-k and weights."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    rows = tile.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < T
    ex = tl.arange(0, BLOCK_E)
    emask = ex < E
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    k_lo = split * K_SPLIT
    for k0 in range(k_lo, tl.minimum(k_lo + K_SPLIT, K), BLOCK_K):
        cols = k0 + kk
        cmask = (cols < K) & (cols < k_lo + K_SPLIT)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + ex[:, None].to(tl.int64) * K + cols[None, :], mask=emask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    last, acc = split_reduce(acc, part_ptr, count_ptr, tile, tl.num_programs(0), split, tl.num_programs(1), BLOCK_T, BLOCK_E)
    if last:
        if HAS_BIAS:
            acc += tl.load(b_ptr + ex, mask=emask, other=0.0).to(tl.float32)[None, :]
        acc = tl.where(emask[None, :], acc, float("-inf"))
        if SOFTMAX_FIRST:  # Qwen3-MoE: softmax over every expert, then the top k of the probabilities
            p = tl.exp(acc - tl.max(acc, axis=1)[:, None])
            acc = tl.where(emask[None, :], p / tl.sum(p, axis=1)[:, None], float("-inf"))
        kx = tl.arange(0, TOP_KP)
        vals = tl.full([BLOCK_T, TOP_KP], float("-inf"), tl.float32)
        ids = tl.zeros([BLOCK_T, TOP_KP], tl.int32)
        for j in tl.static_range(TOP_K):  # the largest left, the lowest id among equals; then taken out
            m = tl.max(acc, axis=1)
            i = tl.minimum(tl.min(tl.where(acc == m[:, None], ex[None, :], BLOCK_E), axis=1), E - 1)  # a NaN row: in range
            vals = tl.where(kx[None, :] == j, m[:, None], vals)
            ids = tl.where(kx[None, :] == j, i[:, None], ids)
            acc = tl.where(ex[None, :] == i[:, None], float("-inf"), acc)
        live = kx[None, :] < TOP_K
        if SOFTMAX_FIRST:
            wts = tl.where(live, vals, 0.0)
            if RENORM:
                wts = wts / tl.sum(wts, axis=1)[:, None]
        else:  # GPT-OSS: softmax over the k logits
            e = tl.where(live, tl.exp(vals - tl.max(vals, axis=1)[:, None]), 0.0)
            wts = e / tl.sum(e, axis=1)[:, None]
        off = rows[:, None] * TOP_K + kx[None, :]
        omask = rmask[:, None] & live
        tl.store(wo_ptr + off, wts, mask=omask)
        tl.store(io_ptr + off, ids.to(tl.int64), mask=omask)


@dispatch.backend("router_topk", "triton", available=available, priority=PRIORITY)
def router_topk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, rule: str,
                norm_topk_prob: bool = False, *, block_t: int = 4, k_split: int = 256, tile_elems: int = 8192,
                num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`.step_ref.router_topk` in one launch: programs of ``block_t`` tokens x ``k_split`` columns (so a
    decode step's few tokens spread over many SMs), their partial logits summed in a fixed order by the last
    to arrive (the same bytes on every run; graph-safe workspace), each reading the weight in its stored dtype."""
    ref.check_router(x, weight, bias, top_k, rule)
    t, h = x.shape
    e = weight.shape[0]
    wts = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=x.device)
    if t:
        x2 = x if x.stride(1) == 1 else x.contiguous()
        block_t = min(block_t, next_pow2(t))
        block_e = next_pow2(e)
        block_k = max(16, min(k_split, tile_elems // (block_t * block_e)))
        k_split = cdiv(max(k_split, block_k), block_k) * block_k
        grid = (cdiv(t, block_t), cdiv(h, k_split))
        part = WORKSPACE.partials(grid[0] * grid[1] * block_t * block_e, x.device)
        count = WORKSPACE.counters(grid[0], x.device)
        _router_kernel[grid](
            x2, weight.contiguous(), wts if bias is None else bias.contiguous(), wts, ids, part, count, t, e, h, k_split, x2.stride(0),
            TOP_K=top_k, TOP_KP=next_pow2(top_k), SOFTMAX_FIRST=rule == "softmax_topk", RENORM=norm_topk_prob,
            HAS_BIAS=bias is not None, BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_K=block_k, num_warps=num_warps,
        )  # fmt: skip
    return wts, ids
