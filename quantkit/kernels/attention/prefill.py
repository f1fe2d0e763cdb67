"""Triton sink-attention prefill (:func:`.attention_ref.attention_prefill`; FlashAttention-2, Dao 2023) over ragged or
paged keys, and helpers decode shares.  The sink seeds the online softmax (m = sink, l = 1), so it joins the
denominator once.  The interpreter multiplies bf16 dot operands as integers: interpreted dots run float32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import dispatch
from . import select
from .attention_ref import check_heads, check_window
from .tables import PrefillConfig
from ..triton_numerics import PRIORITY, available, cdiv, interpreted, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def paged_rows(BT, bt_row, offs_n, n_ok, block_size):
    """Cache rows of key positions ``offs_n``."""
    page = tl.load(BT + bt_row + offs_n // block_size, mask=n_ok, other=0).to(tl.int64)
    return page * block_size + offs_n % block_size


@triton.jit
def softmax_step(qk, v, acc, l_i, m_i, NO_KEY_GUARD: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step (scores in log2 units, -inf masked).  NO_KEY_GUARD: a row may have no key yet."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    if NO_KEY_GUARD:
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(DOT), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def _prefill_loop(acc, l_i, m_i, q, q_pos, K, V, BT, bt_row, k_start, k_len, sk_t, sv_t, offs_d, offs_dv, d_ok, dv_ok,
                  qk_scale, window, block_size, lo, hi,
                  MASKED: tl.constexpr, HAS_WINDOW: tl.constexpr, PAGED: tl.constexpr, BLOCK_N: tl.constexpr,
                  DOT: tl.constexpr, PRECISION: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    k_ptrs = K + (k_start + lo + offs_n0)[:, None] * sk_t + offs_d[None, :]
    v_ptrs = V + (k_start + lo + offs_n0)[:, None] * sv_t + offs_dv[None, :]
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < k_len
        if PAGED:
            rows = paged_rows(BT, bt_row, offs_n, n_ok, block_size)
            k_ptrs = K + rows[:, None] * sk_t + offs_d[None, :]
            v_ptrs = V + rows[:, None] * sv_t + offs_dv[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k.to(DOT)), input_precision=PRECISION) * qk_scale  # [BM, BN] log2 units
        if MASKED:
            ok = (offs_n[None, :] <= q_pos[:, None]) & n_ok[None, :]
            if HAS_WINDOW:
                ok = ok & (offs_n[None, :] > q_pos[:, None] - window)
            qk = tl.where(ok, qk, float("-inf"))
        acc, l_i, m_i = softmax_step(qk, v.to(DOT), acc, l_i, m_i, MASKED, DOT, PRECISION)
        if not PAGED:
            k_ptrs += BLOCK_N * sk_t
            v_ptrs += BLOCK_N * sv_t
    return acc, l_i, m_i


@triton.jit
def _prefill_kernel(Q, K, V, O, SINKS, CU_Q, CU_K, BT,
                    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, s_bt,
                    qk_scale, window, block_size, num_m_blocks,
                    GROUP: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HAS_SINKS: tl.constexpr, HAS_WINDOW: tl.constexpr, PAGED: tl.constexpr,
                    DOT: tl.constexpr, PRECISION: tl.constexpr):
    m0 = (num_m_blocks - 1 - tl.program_id(0)) * BLOCK_M  # heaviest (latest) query blocks first
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(CU_Q + b)
    q_len = tl.load(CU_Q + b + 1) - q_start
    if m0 >= q_len:
        return
    k_start = tl.load(CU_K + b).to(tl.int64)
    k_len = (tl.load(CU_K + b + 1) - k_start).to(tl.int32)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < q_len
    q_pos = k_len - q_len + offs_m
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_D
    dv_ok = offs_dv < HEAD_DV
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * sq_t + h * sq_h + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(DOT)
    if HAS_SINKS:
        m_i = tl.zeros([BLOCK_M], tl.float32) + tl.load(SINKS + h).to(tl.float32) * 1.4426950408889634
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    kvh = h // GROUP
    K += kvh * sk_h
    V += kvh * sv_h
    bt_row = b.to(tl.int64) * s_bt
    # keys [lo, full_lo) masked (window edge), [full_lo, full_hi) unmasked, [full_hi, hi) masked (diagonal)
    p_first = k_len - q_len + m0
    p_last = k_len - q_len + tl.minimum(m0 + BLOCK_M, q_len) - 1
    hi = p_last + 1
    if HAS_WINDOW:
        lo = tl.maximum(p_first - window + 1, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(p_last - window + 1, 0), BLOCK_N) * BLOCK_N
    else:
        lo = 0
        full_lo = 0
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.maximum((p_first + 1) // BLOCK_N * BLOCK_N, full_lo)
    acc, l_i, m_i = _prefill_loop(acc, l_i, m_i, q, q_pos, K, V, BT, bt_row, k_start, k_len, sk_t, sv_t, offs_d, offs_dv,
                                  d_ok, dv_ok, qk_scale, window, block_size, lo, full_lo,
                                  True, HAS_WINDOW, PAGED, BLOCK_N, DOT, PRECISION)
    acc, l_i, m_i = _prefill_loop(acc, l_i, m_i, q, q_pos, K, V, BT, bt_row, k_start, k_len, sk_t, sv_t, offs_d, offs_dv,
                                  d_ok, dv_ok, qk_scale, window, block_size, full_lo, full_hi,
                                  False, HAS_WINDOW, PAGED, BLOCK_N, DOT, PRECISION)
    acc, l_i, m_i = _prefill_loop(acc, l_i, m_i, q, q_pos, K, V, BT, bt_row, k_start, k_len, sk_t, sv_t, offs_d, offs_dv,
                                  d_ok, dv_ok, qk_scale, window, block_size, full_hi, hi,
                                  True, HAS_WINDOW, PAGED, BLOCK_N, DOT, PRECISION)
    out = acc / tl.where(m_ok, l_i, 1.0)[:, None]  # rows past the sequence may have seen no key
    o_ptrs = O + q_rows[:, None] * so_t + h * so_h + offs_dv[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_ok[:, None] & dv_ok[None, :])


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def dot_dtype(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """(dot operand dtype, precision): the input's compiled (fp32 as IEEE), float32 interpreted."""
    assert dtype in _TL_DTYPES, f"attention kernels read {tuple(_TL_DTYPES)}, got {dtype}"
    dot = tl.float32 if interpreted() else _TL_DTYPES[dtype]
    return dot, ("ieee" if dot == tl.float32 else "tf32")


def check_layout(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
    assert t.stride(-1) == 1, f"{name}: the head dim must be contiguous, got strides {t.stride()}"
    assert t.dtype == dtype, f"{name} is {t.dtype}, q is {dtype}: the kernels read one dtype"
    assert t.device == device, f"{name} is on {t.device}, q on {device}"


def check_sinks(sinks: torch.Tensor | None, device: torch.device) -> None:
    assert sinks is None or (sinks.device == device and sinks.is_contiguous()), f"sinks must be contiguous on {device}"


def check_index(name: str, t: torch.Tensor, device: torch.device) -> None:
    assert t.dtype in (torch.int32, torch.int64) and t.device == device, f"{name}: int32/int64 on {device}, got {t.dtype} on {t.device}"
    assert t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}"


def check_operands(tensors: dict[str, torch.Tensor], indices: dict[str, torch.Tensor], sinks: torch.Tensor | None = None) -> torch.device:
    """The launchers' layout checks; -> the device."""
    first = next(iter(tensors.values()))
    for name, t in tensors.items():
        check_layout(name, t, first.dtype, first.device)
    for name, t in indices.items():
        check_index(name, t, first.device)
    check_sinks(sinks, first.device)
    return first.device


def pow2(n: int, least: int = 16) -> int:
    return max(least, next_pow2(n))


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
    *,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Ragged causal sink attention -> [T, Hq, Dv]; ``config`` None: the selection's (:func:`choose`)."""
    check_heads(q, k, v, sinks)
    check_window(window)
    paged = block_tables is not None
    indices = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k, **({"block_tables": block_tables} if paged else {})}
    dev = check_operands({"q": q, "k": k, "v": v}, indices, sinks)
    assert cu_seqlens_q.shape == cu_seqlens_k.shape, f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} vs cu_seqlens_k {tuple(cu_seqlens_k.shape)}"
    if paged:
        assert block_size >= 1 and block_tables.shape[0] == cu_seqlens_q.shape[0] - 1, "paged prefill: block_size >= 1, one table row per sequence"
    t, hq, d = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    out = torch.empty(t, hq, dv, dtype=q.dtype, device=dev)  # [T, Hq, Dv]
    n_seqs = cu_seqlens_q.shape[0] - 1
    if t == 0 or n_seqs == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    cfg = config or choose(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, sinks, window, block_tables, block_size).config
    dot, precision = dot_dtype(q.dtype)
    num_m_blocks = cdiv(max_seqlen_q, cfg.block_m)
    bt = block_tables if paged else cu_seqlens_q  # unread when not paged
    _prefill_kernel[(num_m_blocks, hq, n_seqs)](
        q, k, v, out, sinks if sinks is not None else q, cu_seqlens_q, cu_seqlens_k, bt,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        bt.stride(0), scale * LOG2E, window or 0, max(block_size, 1), num_m_blocks,
        GROUP=hq // hkv, HEAD_D=d, HEAD_DV=dv, BLOCK_D=pow2(d), BLOCK_DV=pow2(dv), BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, HAS_SINKS=sinks is not None, HAS_WINDOW=window is not None, PAGED=paged,
        DOT=dot, PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


TRITON = "interpreter" if interpreted() else "compiled"


def choose(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, sinks=None, window=None, block_tables=None, block_size=0, max_seqlen_q=None,
           *, config: PrefillConfig | None = None) -> dispatch.Choice:
    """:func:`.select.select_prefill` for these operands, its leaf bound."""
    shape = select.prefill_shape(q, k, v, cu_seqlens_q, sinks, window, block_tables, block_size)
    return _bound(dispatch.target(q.device), shape, config)


@functools.lru_cache(maxsize=1024)
def _bound(t: dispatch.Target, shape: select.Shape, config: PrefillConfig | None) -> dispatch.Choice:
    c = select.select_prefill(t, shape, "triton", triton=TRITON, config=config)
    return select.bind(c, attention_prefill, config=c.config)


dispatch.register("attention_prefill", "triton", attention_prefill, available=available, priority=PRIORITY, select=choose)
dispatch.register_map("attention_prefill", select.prefill_map)
