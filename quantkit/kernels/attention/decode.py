"""Triton paged decode with sinks and sliding window: flash-decoding over the engine's paged KV cache.

Computes :func:`.attention.attention_decode` (layouts and numerics there) for one new token per
sequence, whose key is already in the cache at position context_len - 1.

Flash-decoding (Dao et al. 2023): one program per (sequence, kv head, split) holds all Hq/Hkv
query heads of its group as the rows of one dot, so each K/V byte is read once.  With several
splits, each writes its normalised partial o = acc / l and lse = m + log2 l (float32, base 2) and
a second kernel merges them with the sink: with M = max(max_s lse_s, sink),
out = sum_s 2^(lse_s - M) o_s / (sum_s 2^(lse_s - M) + 2^(sink - M)).  With one split (large
batches) the sink seeds the online softmax as in prefill and the kernel writes the output.
The split count depends only on shapes (B, Hkv, block table width, window), never on the
context lengths' values, so a decode step can be captured in a CUDA graph.

Helpers (dot dtype, layout checks) and the interpreter note are in :mod:`.attention_triton`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import dispatch
from .attention_ref import check_heads, check_window
from .prefill import LOG2E, check_operands, dot_dtype, paged_rows, pow2, softmax_step
from ..triton_numerics import PRIORITY, available, cdiv, interpreted, pdl_enter, pdl_ok

MAX_SPLITS = 64


@dataclass(frozen=True)
class DecodeConfig:
    """Launch configuration.  Defaults: the best of 6 tiles x 17 split counts swept on the H200
    (docs/benchmarks.md, "Sink attention decode: launch configuration and splits"): 128-key
    blocks, 2 stages, and splits for about 4 programs per SM; counts that overshoot one such wave
    without filling a second ran slower (B=32, ctx 4096: 2 splits 77% of HBM, 3 splits 68%).  The split and merge
    kernels launch as programmatic dependents (``pdl``, where that exists): 1.05-1.19x at B = 1 and at B = 8 to ctx 4096,
    1.00-1.02x elsewhere, the same bytes (docs/benchmarks.md, "Fifteenth pass")."""

    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int = 0  # 0: chosen from the SM count and the shapes (programs_per_sm, max_splits)
    programs_per_sm: int = 4
    max_splits: int = 128
    pdl: bool = True  # split and merge kernels as programmatic dependents (compiled sm_90+; triton_numerics.pdl_enter)

    def name(self) -> str:
        return f"n{self.block_n}/w{self.num_warps}/st{self.num_stages}/s{self.num_splits or 'auto'}" + ("/pdl" if self.pdl else "")


INTERPRETER_DECODE = DecodeConfig(16, 1, 1)


@triton.jit
def split_range(start, ctx, split, num_splits, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) of ``split``: start .. ctx - 1 cut into num_splits runs of whole key blocks."""
    per = tl.cdiv(tl.cdiv(ctx - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * per
    return lo, tl.minimum(lo + per, ctx)


@triton.jit
def write_split(acc, m_i, l_i, o_ptrs, part_ptrs, lse_ptrs, mask, h_ok, FINAL: tl.constexpr):
    """The end of a split-KV program: with one split (FINAL) the output acc / l (l > 0: a context
    has >= 1 key); else the split's partial acc / l and its log2-sum-exp2, -inf when it saw no key
    (float32 [rows, cols] and [rows]), for :func:`merge_splits`."""
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
    if HAS_WINDOW:  # the new token is at position ctx - 1: keys ctx - window .. ctx - 1
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
    if FINAL:  # one split: the sink seeds the softmax as in prefill and the output is final
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
        qk = tl.where(n_ok[None, :], qk, float("-inf"))  # offs_n[0] < hi: every row keeps a finite max
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
    m = tl.max(lse, 0)  # finite: a context has >= 1 key, so some split is not empty
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


def num_splits(batch: int, head_groups: int, max_keys: int, block_n: int, device: torch.device,
               programs_per_sm: int = 0, max_splits: int = MAX_SPLITS) -> int:
    """Splits per (sequence, head group: a kv head here, a head block in MLA) from shapes only, at
    least one key block each.  ``programs_per_sm`` > 0: as many splits as keep the programs within
    that many per SM (rounded down: a partial second wave cost more than it gained); 0: at least
    two programs per SM (rounded up; MLA's measured rule)."""
    sms, groups = dispatch.sm_count(device), batch * head_groups  # cached per device; the interpreter's 8
    want = programs_per_sm * sms // groups if programs_per_sm else cdiv(2 * sms, groups)
    return max(1, min(want, cdiv(max_keys, block_n), max_splits))


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
    """Paged decode with sinks and window (see :func:`.attention.attention_decode`) -> [B, Hq, Dv]."""
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
    cfg = config or (INTERPRETER_DECODE if interpreted() else DecodeConfig())
    max_keys = block_tables.shape[1] * block_size
    if window is not None:
        max_keys = min(max_keys, window)
    splits = cfg.num_splits or num_splits(b, hkv, max_keys, cfg.block_n, dev, cfg.programs_per_sm, cfg.max_splits)
    dot, precision = dot_dtype(q.dtype)
    group, final = hq // hkv, splits == 1
    # per-split o = acc / l and log2-sum-exp2; a single split writes the output directly
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
    """out [B, H, Dv] = the splits' partial outputs part float32 [B, H, S, Dv] weighted by their
    log2-sum-exp2 lse float32 [B, H, S] (the sink, float32 [H] natural-log units, joins the
    denominator); split-KV decode of the sink attention and of MLA.  ``pdl``: launched as a programmatic dependent
    (dropped where that does not exist)."""
    pdl = pdl_ok(out.device, pdl)
    b, h, splits, dv = part.shape
    _decode_merge_kernel[(b, h)](
        part, lse, sinks if sinks is not None else part, out,
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), splits,
        BLOCK_S=pow2(splits, 2), HEAD_DV=dv, BLOCK_DV=pow2(dv), HAS_SINKS=sinks is not None, PDL=pdl,
        num_warps=1 if interpreted() else 4, launch_pdl=pdl,
    )


dispatch.register("attention_decode", "triton", attention_decode, available=available, priority=PRIORITY)
