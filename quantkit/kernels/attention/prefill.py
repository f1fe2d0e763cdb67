"""Triton sink attention prefill: flash attention over ragged (or paged) keys; helpers shared with decode.

Computes the function of :mod:`.attention` (layouts and numerics there): per-head sinks, sliding
window, GQA, causal with bottom-right aligned positions; bf16/fp16/fp32 in and out, float32
softmax and accumulators, bf16/fp16 tensor-core dots (fp32 inputs: IEEE fp32 dots).

* Prefill (FlashAttention-2 forward, Dao 2023; the Triton tutorial 06-fused-attention): one
  program per (BLOCK_M queries, query head, sequence), online softmax in base 2 (the scale folded
  into log2(e)).  The sink seeds the running max and denominator: m = sink * log2(e), l = 1
  (exp2(sink - m) = 1), so it joins the denominator exactly once, unscaled, and adds nothing to
  the numerator.  Keys run in three loops: blocks cut by the window's left edge (masked), blocks
  every query of the tile sees (unmasked), blocks on the causal diagonal (masked).  Query blocks
  run heaviest first.  Keys are rows of a ragged k/v, or gathered through a block table.
* Decode: :mod:`.attention_triton_decode`, with the helpers here.

Triton's CPU interpreter multiplies bf16 dot operands as raw integers, so interpreted runs cast
dot operands to float32 (``dot_dtype``); the GPU tests cover the bf16 dots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import dispatch
from .attention_ref import check_heads, check_window
from ..triton_numerics import PRIORITY, available, cdiv, interpreted, next_pow2

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def name(self) -> str:
        return f"{self.block_m}x{self.block_n}/w{self.num_warps}/st{self.num_stages}"


INTERPRETER_PREFILL = PrefillConfig(16, 16, 1, 1)


@triton.jit
def paged_rows(BT, bt_row, offs_n, n_ok, block_size):
    """Cache rows of key positions ``offs_n`` through the sequence's block-table row (pages of ``block_size``)."""
    page = tl.load(BT + bt_row + offs_n // block_size, mask=n_ok, other=0).to(tl.int64)
    return page * block_size + offs_n % block_size


@triton.jit
def softmax_step(qk, v, acc, l_i, m_i, NO_KEY_GUARD: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step: scores qk [rows, BN] (log2 units, -inf where masked) and values
    v [BN, dv] (DOT) rescale and extend (acc, l_i, m_i), returned in that order.  NO_KEY_GUARD: a
    row may have seen no key yet (no sink), so keep exp2 away from -inf - -inf."""
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
    # ragged keys: row pointers advance by BLOCK_N rows; paged keys: gathered through the block table
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
        else:  # every key of the block exists and is visible to every query of the tile
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
    if HAS_SINKS:  # the sink seeds the online softmax: m = sink (log2 units), l = exp2(0) = 1
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
    # key ranges: [lo, full_lo) masked (window edge), [full_lo, full_hi) unmasked, [full_hi, hi) masked (diagonal)
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
    """Dot operand dtype and input precision: the input dtype compiled (fp32 as IEEE, not TF32),
    float32 in the interpreter (see the module docstring)."""
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
    """The launchers' input checks: every tensor read like the first (dtype, device, contiguous
    head dim), index tensors int32/int64 on its device, sinks contiguous there; -> the device."""
    first = next(iter(tensors.values()))
    for name, t in tensors.items():
        check_layout(name, t, first.dtype, first.device)
    for name, t in indices.items():
        check_index(name, t, first.device)
    check_sinks(sinks, first.device)
    return first.device


def pow2(n: int, least: int = 16) -> int:
    return max(least, next_pow2(n))


def default_prefill_config(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> PrefillConfig:
    """H200 sweep (scripts/bench_attention.py, 8192 tokens, 64 / 8 heads, d 64, bf16): 64 x 64 / 4
    warps / 3 stages took 1.370 ms full causal and 0.155 ms with window 128, against 1.520 / 0.196
    for 128 x 64 (the best of 13 configs in both).  Larger heads keep 128 x 64 / 8 warps (not swept).
    float32 operands take twice the shared memory: above d 64 (MLA's 192 pads to 256) the bf16 tiles
    need 361 KB against the H200's 227 KB, so float32 runs 64 x 32 tiles in 2 stages (160 KB)."""
    if interpreted():
        return INTERPRETER_PREFILL
    if head_dim <= 64:
        return PrefillConfig(64, 64, 4, 3)
    return PrefillConfig(64, 32, 4, 2) if dtype == torch.float32 else PrefillConfig(128, 64, 8, 3)


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
    """Ragged causal sink attention (see :func:`.attention.attention_prefill`) -> [T, Hq, Dv]."""
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
    cfg = config or default_prefill_config(d, q.dtype)
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


dispatch.register("attention_prefill", "triton", attention_prefill, available=available, priority=PRIORITY)
