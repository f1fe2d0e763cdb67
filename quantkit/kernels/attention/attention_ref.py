"""Sink attention ops, their torch references (GPT-OSS: transformers ``eager_attention_forward``).

s = q.k * scale in float32; a query at position p sees key j <= p, and with window W only j > p - W.  A per-head sink
joins the softmax denominator unscaled: out = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sink - m)).  Query head
h reads kv head h // (Hq / Hkv).  Out in q's dtype.

* ``attention_prefill``: q [T, Hq, D] ragged by ``cu_seqlens_q``; k, v [Tk, Hkv, D|Dv] ragged by ``cu_seqlens_k``, or
  the paged cache -> [T, Hq, Dv].
* ``attention_decode``: q [B, Hq, D], one token per sequence; the paged cache, ``context_lens`` -> [B, Hq, Dv].

Paged cache: [blocks * block_size, Hkv, D], slot s of block b at row b * block_size + s; ``block_tables`` [B, W], -1
past a sequence's blocks.  Positions are bottom-right aligned: of Lq queries over Lk keys, query i is at Lk - Lq + i.
"""

from __future__ import annotations

import torch

from .. import dispatch


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """One sequence: q [n, Hq, D], k [m, Hkv, D], v [m, Hkv, Dv] -> float32 [n, Hq, Dv]."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not group over {hkv} kv heads")
    rep = hq // hkv
    kf = k.to(torch.float32).repeat_interleave(rep, dim=1)  # [m, Hq, D]
    vf = v.to(torch.float32).repeat_interleave(rep, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.to(torch.float32), kf) * scale
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.to(torch.float32).reshape(hq, 1, 1).expand(hq, s.shape[1], 1)
        s = torch.cat((s, sink), dim=-1)
    s = s - s.amax(dim=-1, keepdim=True)
    p = torch.softmax(s, dim=-1)
    if sinks is not None:
        p = p[..., :-1]
    return torch.einsum("hnm,mhd->nhd", p, vf)


def paged_rows(block_tables: torch.Tensor, b: int, n: int, block_size: int) -> torch.Tensor:
    """Cache rows of the first ``n`` keys of sequence ``b``: int64 [n]."""
    nb = -(-n // block_size)
    blocks = block_tables[b, :nb].to(torch.int64)
    if nb and int(blocks.min()) < 0:
        raise ValueError(f"sequence {b}: block table has no block for some of its {n} keys")
    offs = torch.arange(block_size, device=blocks.device)
    return (blocks[:, None] * block_size + offs).flatten()[:n]


def check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None) -> None:
    """The shape rules every backend shares."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"attention wants q [T, Hq, D], k [., Hkv, D], v [., Hkv, Dv]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1] or q.shape[2] != k.shape[2] or k.shape[0] != v.shape[0]:
        raise ValueError(f"attention shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if sinks is not None and tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"sinks must be [Hq] = [{q.shape[1]}], got {tuple(sinks.shape)}")


def check_window(window: int | None) -> None:
    if window is not None and window < 1:
        raise ValueError(f"sliding window must be >= 1 key, got {window}")


def attention_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    window: int | None = None,
    block_tables: torch.Tensor | None = None,
    block_size: int = 0,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """-> [T, Hq, Dv].  With ``block_tables`` k/v are the paged cache; ``max_seqlen_q`` is a launch hint."""
    check_heads(q, k, v, sinks)
    check_window(window)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if len(cq) != len(ck) or cq[-1] != q.shape[0] or (block_tables is None and ck[-1] != k.shape[0]):
        raise ValueError(f"cu_seqlens_q {cq} / cu_seqlens_k {ck} do not fit q {tuple(q.shape)}, k {tuple(k.shape)}")
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    for b in range(len(cq) - 1):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if lq > lk:
            raise ValueError(f"sequence {b}: {lq} queries but only {lk} keys (queries must be the last keys)")
        if lq == 0:
            continue
        if block_tables is None:
            rows = torch.arange(ck[b], ck[b + 1], device=k.device)
        else:
            rows = paged_rows(block_tables, b, lk, block_size)
        q_pos = torch.arange(lk - lq, lk, device=q.device)
        k_pos = torch.arange(lk, device=q.device)
        out[cq[b] : cq[b + 1]] = attend(q[cq[b] : cq[b + 1]], k[rows], v[rows], q_pos, k_pos, scale, sinks, window).to(q.dtype)
    return out


def attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    sinks: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """One new token per sequence over the paged cache -> [B, Hq, Dv]."""
    check_heads(q, k_cache, v_cache, sinks)
    check_window(window)
    lens = context_lens.tolist()
    if len(lens) != q.shape[0] or block_tables.shape[0] != q.shape[0] or min(lens, default=1) < 1:
        raise ValueError(f"decode: q {tuple(q.shape)}, block_tables {tuple(block_tables.shape)}, context_lens {lens} (each >= 1)")
    out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[2], dtype=q.dtype, device=q.device)
    for b, n in enumerate(lens):
        rows = paged_rows(block_tables, b, n, block_size)
        q_pos = torch.tensor([n - 1], device=q.device)
        k_pos = torch.arange(n, device=q.device)
        out[b] = attend(q[b : b + 1], k_cache[rows], v_cache[rows], q_pos, k_pos, scale, sinks, window)[0].to(q.dtype)
    return out


OPS = {"attention_prefill": attention_prefill, "attention_decode": attention_decode}


def _register() -> None:
    for op, fn in OPS.items():
        dispatch.register(op, dispatch.REFERENCE, fn)


_register()
