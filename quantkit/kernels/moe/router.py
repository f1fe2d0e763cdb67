"""Triton backend of :mod:`.router_ref` in one launch: K-split float32 partial logits, summed in fixed order by the
last program to arrive (a decode step's few tokens spread over many SMs; the same bytes on every run)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..gemm.block_scaled import WORKSPACE, split_reduce
from ..triton_numerics import PRIORITY, available, cdiv, next_pow2
from . import router_ref as ref


@triton.jit
def _router_kernel(x_ptr, w_ptr, b_ptr, wo_ptr, io_ptr, part_ptr, count_ptr, T, E, K, K_SPLIT, stride_x, TOP_K: tl.constexpr,
                   TOP_KP: tl.constexpr, SOFTMAX_FIRST: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """BLOCK_T tokens x one K_SPLIT-column slice of the logits; the last slice to arrive sums them in order, then
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
    """:func:`.router_ref.router_topk`: programs of ``block_t`` tokens x ``k_split`` columns, the weight read in its
    stored dtype."""
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
