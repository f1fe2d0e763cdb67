"""MoE routing (:func:`route`, the engine's torch calls: bit-identical, ties included) and token alignment (vLLM
``moe_align_block_size``): the T*k pairs, flat index ``t * k + j``, stably sorted by expert, each expert's segment
padded to a multiple of BLOCK_M with the sentinel T*k, in buffers sized by the shapes alone (CUDA-graph safe).
Expert ids outside [0, E) fail as torch's scatter does (no host sync on CUDA).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..triton_numerics import cdiv, next_pow2, pdl_enter, pdl_ok

RULES = ("topk_softmax", "softmax_topk", "grouped_sigmoid")


def route(
    logits: torch.Tensor,
    rule: str,
    top_k: int,
    *,
    norm_topk_prob: bool = False,
    n_group: int = 1,
    topk_group: int = 1,
    scaling: float = 1.0,
    correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits [T, E] -> (weights float32 [T, k], ids int64 [T, k]): ``topk_softmax`` (GPT-OSS),
    ``softmax_topk`` (Qwen3-MoE), ``grouped_sigmoid`` (DeepSeek-V3: best ``topk_group`` of ``n_group`` groups)."""
    if rule not in RULES:
        raise ValueError(f"routing rule must be one of {RULES}, not {rule!r}")
    if rule == "topk_softmax":
        top, idx = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top, dim=1), idx
    if rule == "softmax_topk":
        top, idx = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float), top_k, dim=-1)
        if norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top, idx
    e = logits.shape[-1]
    if e % n_group:
        raise ValueError(f"grouped_sigmoid: {e} experts do not split into {n_group} groups")
    scores = logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias
    groups = choice.view(-1, n_group, e // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    gidx = torch.topk(groups, k=topk_group, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(groups).scatter_(1, gidx, 1)
    emask = gmask.unsqueeze(-1).expand(-1, n_group, e // n_group).reshape(-1, e)
    idx = torch.topk(choice.masked_fill(~emask.bool(), float("-inf")), k=top_k, dim=-1, sorted=False)[1]
    w = scores.gather(1, idx)
    if norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scaling, idx


class Alignment(NamedTuple):
    sorted_ids: torch.Tensor  # int32 [cap]: flat (token, slot) index, or n (padding)
    expert_ids: torch.Tensor  # int32 [cap / block_m]: expert of each block, -1 past the end
    num_padded: torch.Tensor  # int32 [1]
    block_m: int


def align_capacity(n: int, num_experts: int, block_m: int) -> int:
    """Rows of ``sorted_ids`` for n pairs: at most min(E, n) experts are hit, each wasting at most block_m - 1 rows."""
    worst = n + min(num_experts, n) * (block_m - 1)
    return cdiv(worst, block_m) * block_m


def _check_ids(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> int:
    assert topk_ids.dim() == 2 and not topk_ids.is_floating_point(), f"expert ids must be integer [T, k], got {topk_ids.dtype}{tuple(topk_ids.shape)}"
    assert num_experts >= 1 and block_m >= 1 and block_m & (block_m - 1) == 0, f"E={num_experts}, BLOCK_M={block_m} (a power of two)"
    return topk_ids.numel()


def align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """The reference: stable sort, scatter, searchsorted; no host sync."""
    n = _check_ids(topk_ids, num_experts, block_m)
    dev = topk_ids.device
    cap = align_capacity(n, num_experts, block_m)
    flat = topk_ids.reshape(-1).to(torch.int64)  # [n]
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))  # [E]
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)  # [E]
    sorted_e, perm = torch.sort(flat, stable=True)
    rank = torch.arange(n, device=dev) - (counts.cumsum(0) - counts)[sorted_e]  # position within its expert
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, (ends - padded)[sorted_e] + rank, perm.to(torch.int32))
    starts = torch.arange(0, cap, block_m, device=dev)
    e_of_block = torch.searchsorted(ends, starts, right=True)  # [cap / block_m]
    expert_ids = torch.where(e_of_block < num_experts, e_of_block, -1).to(torch.int32)
    return Alignment(sorted_ids, expert_ids, ends[-1:].to(torch.int32), block_m)


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ptr, expert_ptr, npad_ptr, n, cap, n_blocks,
    E: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One program, work n * E: counts per expert, padded exclusive scan, then each chunk's ranks -> dest."""
    ex = tl.arange(0, E_P2)
    c = tl.arange(0, CHUNK)
    counts = tl.zeros((E_P2,), dtype=tl.int32)
    for c0 in range(0, n, CHUNK):
        raw = tl.load(ids_ptr + c0 + c, mask=c0 + c < n, other=0)  # int32 or int64, checked before narrowing
        tl.device_assert((raw >= 0) & (raw < E), "expert id out of range [0, E)")
        ids = tl.where(c0 + c < n, raw.to(tl.int32), E_P2)  # E_P2 matches no expert
        counts += tl.sum((ids[:, None] == ex[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)  # [E_P2]; experts >= E have 0 rows
    for f0 in range(0, cap, CHUNK):  # padding everywhere first
        tl.store(sorted_ptr + f0 + c, tl.full((CHUNK,), 0, tl.int32) + n, mask=f0 + c < cap)
    tl.debug_barrier()  # padding lands before the ids
    seen = ends - padded  # next free row of each expert
    for c0 in range(0, n, CHUNK):
        ids = tl.load(ids_ptr + c0 + c, mask=c0 + c < n, other=E_P2).to(tl.int32)
        hit = (ids[:, None] == ex[None, :]).to(tl.int32)  # [CHUNK, E_P2]
        before = tl.cumsum(hit, axis=0) - hit  # same-expert entries earlier in the chunk
        dest = tl.sum(hit * (before + seen[None, :]), axis=1)
        tl.store(sorted_ptr + dest, c0 + c, mask=c0 + c < n)
        seen += tl.sum(hit, axis=0)
    for b0 in range(0, n_blocks, CHUNK):
        start = (b0 + c) * BLOCK_M
        e_of_b = tl.sum((ends[None, :] <= start[:, None]).to(tl.int32), axis=1)
        tl.store(expert_ptr + b0 + c, tl.where(e_of_b < E, e_of_b, -1), mask=b0 + c < n_blocks)
    tl.store(npad_ptr, tl.sum(padded, axis=0))


# Pairwise compares cost n**2, per-expert ones n * E: pairwise wins while n <= E; 128 pairs fit one CTA without spills.
SMALL_N_MAX = 128


@triton.jit
def _align_small_kernel(
    ids_ptr, sorted_ptr, expert_ptr, npad_ptr, n, E, cap, n_blocks,
    N: tl.constexpr, BLOCK_M: tl.constexpr, FILL: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """One program for n <= N pairs: ranks, counts and starts by pairwise compares."""
    pdl_enter(PDL)
    i = tl.arange(0, N)
    raw = tl.load(ids_ptr + i, mask=i < n, other=0)  # int32 or int64, checked before narrowing
    tl.device_assert((raw >= 0) & (raw < E), "expert id out of range [0, E)")
    ids = tl.where(i < n, raw.to(tl.int32), -1)  # [N]; -1: no pair
    same = (ids[:, None] == ids[None, :]) & (ids[None, :] >= 0)  # [N, N]: pairs i and j on one expert
    rank = tl.sum((same & (i[None, :] < i[:, None])).to(tl.int32), axis=1)  # earlier pairs of its expert
    count = tl.sum(same.to(tl.int32), axis=1)
    padded = tl.where((rank == 0) & (ids >= 0), (count + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)  # at first pairs only
    start = tl.sum(tl.where(ids[None, :] < ids[:, None], padded[None, :], 0), axis=1)  # rows of lower experts
    for f0 in range(0, cap, FILL):  # padding everywhere first
        f = f0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + f, tl.full((FILL,), 0, tl.int32) + n, mask=f < cap)
    tl.debug_barrier()  # padding lands before the ids
    tl.store(sorted_ptr + start + rank, i, mask=i < n)
    row = i * BLOCK_M  # first row of block i; cap / BLOCK_M <= n <= N blocks
    inside = (start[None, :] <= row[:, None]) & (row[:, None] < start[None, :] + padded[None, :])  # [N blocks, N]
    tl.store(expert_ptr + i, tl.max(tl.where(inside, ids[None, :], -1), axis=1), mask=i < n_blocks)
    tl.store(npad_ptr, tl.sum(padded, axis=0))


def _check_range(ids: torch.Tensor, num_experts: int) -> None:
    """Out-of-range ids raise :func:`align_torch`'s RuntimeError on the CPU; on CUDA the kernels assert on the device."""
    if ids.is_cuda:
        return
    bad = ids[(ids < 0) | (ids >= num_experts)]
    if bad.numel():
        raise RuntimeError(f"index {int(bad[0])} is out of bounds for dimension 0 with size {num_experts}")


def align_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int, pdl: bool = False) -> Alignment:
    """:func:`align_torch`'s bytes in one launch: pairwise to ``SMALL_N_MAX`` pairs, else per expert.  ``pdl``: the
    pairwise kernel launches as a programmatic dependent."""
    n = _check_ids(topk_ids, num_experts, block_m)
    ids = topk_ids.reshape(-1).contiguous()  # [n], int32 or int64: the kernels read either
    _check_range(ids, num_experts)
    cap = align_capacity(n, num_experts, block_m)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=ids.device)  # [cap]
    expert_ids = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)  # [cap / BM]
    num_padded = torch.empty(1, dtype=torch.int32, device=ids.device)
    out = (sorted_ids, expert_ids, num_padded)
    # debug=True keeps the device assertion on ids
    opts = {"debug": True, "sanitize_overflow": False}
    pdl = pdl_ok(ids.device, pdl)
    if n <= SMALL_N_MAX:
        n_p2 = max(16, next_pow2(n))  # one compile per (N, BLOCK_M), none per E
        warps = max(4, n_p2 * n_p2 // 1024)  # at most 32 values of an [N, N] tile per thread
        fill = min(2048, n_p2 * block_m)  # padding rows per store; cap <= n * BLOCK_M
        _align_small_kernel[(1,)](ids, *out, n, num_experts, cap, cap // block_m,
                                  N=n_p2, BLOCK_M=block_m, FILL=fill, PDL=pdl, num_warps=warps, launch_pdl=pdl, **opts)  # fmt: skip
    else:
        e_p2 = next_pow2(num_experts)  # masked entries read E_P2, which matches no column
        chunk = max(16, min(1024, 16384 // e_p2))  # [chunk, E_P2] compare tiles; one compile per E
        _align_kernel[(1,)](ids, *out, n, cap, cap // block_m,
                            E=num_experts, E_P2=e_p2, CHUNK=chunk, BLOCK_M=block_m, num_warps=8, **opts)  # fmt: skip
    return Alignment(sorted_ids, expert_ids, num_padded, block_m)


ONE_PROGRAM_MAX = 2**19  # pairs x experts (padded): above it one program is slower than the torch sort


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int, pdl: bool = False) -> Alignment:
    """:func:`align_triton` (decode) or :func:`align_torch` (prefill, where a few more launches do not matter)."""
    n = topk_ids.numel()
    if n <= SMALL_N_MAX or n * next_pow2(num_experts) <= ONE_PROGRAM_MAX:
        return align_triton(topk_ids, num_experts, block_m, pdl)
    return align_torch(topk_ids, num_experts, block_m)
