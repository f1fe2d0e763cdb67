"""Triton paged decode with sinks and window (:func:`.attention_ref.attention_decode`), flash-decoding (Dao et al.
2023): one program per (sequence, kv head, split) runs its Hq/Hkv query heads as the rows of one dot, so each K/V byte
is read once.  Splits write o = acc / l and lse = m + log2 l; :func:`merge_splits` adds the sink to the denominator.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import dispatch
from . import select
from .attention_ref import check_heads, check_window
from .tables import DecodeConfig
from .prefill import LOG2E, check_operands, dot_dtype, paged_rows, pow2, softmax_step
from ..triton_numerics import PRIORITY, available, interpreted, pdl_enter, pdl_ok


@triton.jit
def split_range(start, ctx, split, num_splits, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) of ``split``: start .. ctx - 1 cut into runs of whole key blocks."""
    per = tl.cdiv(tl.cdiv(ctx - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * per
    return lo, tl.minimum(lo + per, ctx)


@triton.jit
def write_split(acc, m_i, l_i, o_ptrs, part_ptrs, lse_ptrs, mask, h_ok, FINAL: tl.constexpr):
    """FINAL (one split): the output; else the float32 partial and its lse (-inf for a split with no key)."""
    if FINAL:
        tl.store(o_ptrs, (acc / l_i[:, None]).to(o_ptrs.dtype.element_ty), mask=mask)
    else:
        empty = l_i == 0.0
        tl.store(part_ptrs, acc / tl.where(empty, 1.0, l_i)[:, None], mask=mask)
        tl.store(lse_ptrs, tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i))), mask=h_ok)


@triton.jit
def _decode_split_kernel(Q, K, V, BT, CTX, SINKS, O, OP, LSE,
                         sq_b, sq_h, sk_t, sk_h, sv_t, sv_h, s_bt, so_b, so_h, sop_b, sop_h, sop_s, sl_b, sl_h,
                         qk_scale, window, block_size, num_splits,
                         GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_SINKS: tl.constexpr, HAS_WINDOW: tl.constexpr, FINAL: tl.constexpr,
                         DOT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CTX + b).to(tl.int32)
    start = 0
    if HAS_WINDOW:  # keys ctx - window .. ctx - 1
        start = tl.maximum(ctx - window, 0)
    lo, hi = split_range(start, ctx, split, num_splits, BLOCK_N)
    offs_h = tl.arange(0, BLOCK_H)
    h_ok = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_D
    dv_ok = offs_dv < HEAD_DV
    q = tl.load(Q + b.to(tl.int64) * sq_b + heads[:, None] * sq_h + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(DOT)
    K += kvh * sk_h
    V += kvh * sv_h
    bt_row = b.to(tl.int64) * s_bt
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    if FINAL:
        if HAS_SINKS:
            m_i = tl.zeros([BLOCK_H], tl.float32) + tl.load(SINKS + heads, mask=h_ok, other=0.0).to(tl.float32) * 1.4426950408889634
            l_i = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        rows = paged_rows(BT, bt_row, offs_n, n_ok, block_size)
        k = tl.load(K + rows[:, None] * sk_t + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(V + rows[:, None] * sv_t + offs_dv[None, :], mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k.to(DOT)), input_precision=PRECISION) * qk_scale
        qk = tl.where(n_ok[None, :], qk, float("-inf"))
        acc, l_i, m_i = softmax_step(qk, v.to(DOT), acc, l_i, m_i, False, DOT, PRECISION)
    b64 = b.to(tl.int64)
    write_split(acc, m_i, l_i, O + b64 * so_b + heads[:, None] * so_h + offs_dv[None, :],
                OP + b64 * sop_b + heads[:, None] * sop_h + split * sop_s + offs_dv[None, :],
                LSE + b64 * sl_b + heads * sl_h + split, h_ok[:, None] & dv_ok[None, :], h_ok, FINAL)


@triton.jit
def _decode_merge_kernel(OP, LSE, SINKS, O, sop_b, sop_h, sop_s, sl_b, sl_h, so_b, so_h, num_splits,
                         BLOCK_S: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr,
                         HAS_SINKS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < num_splits
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < HEAD_DV
    lse = tl.load(LSE + b * sl_b + h * sl_h + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)  # finite: some split saw a key
    if HAS_SINKS:
        sink = tl.load(SINKS + h).to(tl.float32) * 1.4426950408889634
        m = tl.maximum(m, sink)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    if HAS_SINKS:
        denom += tl.exp2(sink - m)
    o = tl.load(OP + b * sop_b + h * sop_h + offs_s[:, None] * sop_s + offs_dv[None, :], mask=s_ok[:, None] & dv_ok[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / denom
    tl.store(O + b * so_b + h * so_h + offs_dv, out.to(O.dtype.element_ty), mask=dv_ok)


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
    *,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Paged decode with sinks and window -> [B, Hq, Dv]; ``config`` None: the selection's (:func:`choose`)."""
    check_heads(q, k_cache, v_cache, sinks)
    check_window(window)
    dev = check_operands({"q": q, "k_cache": k_cache, "v_cache": v_cache}, {"block_tables": block_tables, "context_lens": context_lens}, sinks)
    b, hq, d = q.shape
    hkv, dv = k_cache.shape[1], v_cache.shape[2]
    assert block_tables.shape[0] == b and context_lens.shape == (b,), f"decode: {b} queries, block_tables {tuple(block_tables.shape)}, context_lens {tuple(context_lens.shape)}"
    assert block_size >= 1, f"block_size must be >= 1, got {block_size}"
    out = torch.empty(b, hq, dv, dtype=q.dtype, device=dev)  # [B, Hq, Dv]
    if b == 0:
        return out
    cfg = config
    if cfg is None or not cfg.num_splits:
        cfg = choose(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, sinks, window, config=cfg).config
    splits = cfg.num_splits
    dot, precision = dot_dtype(q.dtype)
    group, final = hq // hkv, splits == 1
    part = out if final else torch.empty(b, hq, splits, dv, dtype=torch.float32, device=dev)  # [B, Hq, S, Dv]
    lse = out if final else torch.empty(b, hq, splits, dtype=torch.float32, device=dev)  # [B, Hq, S]
    sink_arg = sinks if sinks is not None else q
    pdl = pdl_ok(dev, cfg.pdl)
    _decode_split_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, block_tables, context_lens, sink_arg, out, part, lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1), part.stride(0), part.stride(1), 0 if final else part.stride(2),
        lse.stride(0), lse.stride(1), scale * LOG2E, window or 0, block_size, splits,
        GROUP=group, BLOCK_H=pow2(group), HEAD_D=d, HEAD_DV=dv, BLOCK_D=pow2(d), BLOCK_DV=pow2(dv), BLOCK_N=cfg.block_n,
        HAS_SINKS=sinks is not None, HAS_WINDOW=window is not None, FINAL=final, DOT=dot, PRECISION=precision, PDL=pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )
    if not final:
        merge_splits(part, lse, out, sinks, pdl)
    return out


def merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, sinks: torch.Tensor | None = None, pdl: bool = False) -> None:
    """out [B, H, Dv] from part float32 [B, H, S, Dv] and lse [B, H, S]; the sink (natural-log units) joins the denominator."""
    pdl = pdl_ok(out.device, pdl)
    b, h, splits, dv = part.shape
    _decode_merge_kernel[(b, h)](
        part, lse, sinks if sinks is not None else part, out,
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), splits,
        BLOCK_S=pow2(splits, 2), HEAD_DV=dv, BLOCK_DV=pow2(dv), HAS_SINKS=sinks is not None, PDL=pdl,
        num_warps=1 if interpreted() else 4, launch_pdl=pdl,
    )


TRITON = "interpreter" if interpreted() else "compiled"


def choose(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, sinks=None, window=None, *,
           config: DecodeConfig | None = None) -> dispatch.Choice:
    """:func:`.select.select_decode` for these operands, its leaf bound."""
    return _bound(dispatch.target(q.device), select.decode_shape(q, k_cache, v_cache, block_tables, block_size, sinks, window), config)


@functools.lru_cache(maxsize=1024)
def _bound(t: dispatch.Target, shape: select.Shape, config: DecodeConfig | None) -> dispatch.Choice:
    c = select.select_decode(t, shape, "triton", triton=TRITON, config=config)
    return select.bind(c, attention_decode, config=c.config)


dispatch.register("attention_decode", "triton", attention_decode, available=available, priority=PRIORITY, select=choose)
dispatch.register_map("attention_decode", select.decode_map)
