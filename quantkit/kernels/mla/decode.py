"""Triton MLA decode (:mod:`.mla_ref`): split-KV flash-decoding over the paged latents.  One program per (head block,
sequence, split) loads a latent chunk once for BLOCK_H heads, as key and value; the head blocks of a chunk are
adjacent in the grid, so it comes from HBM about once.  Splits merge as :func:`..attention.decode.merge_splits`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..attention.prefill import LOG2E, check_operands, dot_dtype, paged_rows, pow2, softmax_step
from ..attention.decode import merge_splits, split_range, write_split
from . import select
from .mla_ref import check_mla
from .tables import MLAConfig
from ..triton_numerics import PRIORITY, available, cdiv, interpreted


@triton.jit
def _mla_split_kernel(QL, QR, KV, KR, BT, CTX, O, OP, LSE,
                      sql_b, sql_h, sqr_b, sqr_h, skv_t, skr_t, s_bt, so_b, so_h, sop_b, sop_h, sop_s, sl_b, sl_h,
                      qk_scale, block_size, num_splits, num_heads,
                      RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
                      BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FINAL: tl.constexpr,
                      DOT: tl.constexpr, PRECISION: tl.constexpr):
    hb = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CTX + b).to(tl.int32)
    lo, hi = split_range(0, ctx, split, num_splits, BLOCK_N)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < num_heads
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    r_ok = offs_r < RANK
    p_ok = offs_p < ROPE
    b64 = b.to(tl.int64)
    ql = tl.load(QL + b64 * sql_b + heads[:, None] * sql_h + offs_r[None, :], mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    qr = tl.load(QR + b64 * sqr_b + heads[:, None] * sqr_h + offs_p[None, :], mask=h_ok[:, None] & p_ok[None, :], other=0.0)
    ql = ql.to(DOT)
    qr = qr.to(DOT)
    bt_row = b64 * s_bt
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        rows = paged_rows(BT, bt_row, offs_n, n_ok, block_size)
        c = tl.load(KV + rows[:, None] * skv_t + offs_r[None, :], mask=n_ok[:, None] & r_ok[None, :], other=0.0).to(DOT)  # [BN, BR]
        kr = tl.load(KR + rows[:, None] * skr_t + offs_p[None, :], mask=n_ok[:, None] & p_ok[None, :], other=0.0).to(DOT)  # [BN, BP]
        qk = tl.dot(ql, tl.trans(c), input_precision=PRECISION)
        qk = tl.dot(qr, tl.trans(kr), qk, input_precision=PRECISION) * qk_scale  # [BH, BN] log2 units
        qk = tl.where(n_ok[None, :], qk, float("-inf"))
        acc, l_i, m_i = softmax_step(qk, c, acc, l_i, m_i, False, DOT, PRECISION)
    write_split(acc, m_i, l_i, O + b64 * so_b + heads[:, None] * so_h + offs_r[None, :],
                OP + b64 * sop_b + heads[:, None] * sop_h + split * sop_s + offs_r[None, :],
                LSE + b64 * sl_b + heads * sl_h + split, h_ok[:, None] & r_ok[None, :], h_ok, FINAL)


def _check(q_lat, q_rot, kv, k_rot, block_tables, context_lens, block_size, cfg: MLAConfig) -> None:
    check_mla(q_lat, q_rot, kv, k_rot, block_tables, context_lens)
    check_operands({"q_lat": q_lat, "q_rot": q_rot, "kv": kv, "k_rot": k_rot}, {"block_tables": block_tables, "context_lens": context_lens})
    assert block_size >= 1, f"block_size must be >= 1, got {block_size}"
    assert cfg.block_h >= 16 and cfg.block_n >= 16, f"tl.dot needs tiles of >= 16 rows: {cfg.name()}"


def mla_decode(
    q_lat: torch.Tensor,
    q_rot: torch.Tensor,
    kv: torch.Tensor,
    k_rot: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    *,
    config: MLAConfig | None = None,
) -> torch.Tensor:
    """-> o_lat [B, H, rank]; ``config`` None: the selection's."""
    cfg = config
    if cfg is None or not cfg.num_splits:
        cfg = select.choose(q_lat, q_rot, kv, k_rot, block_tables, context_lens, block_size, scale, backend="triton", triton=TRITON,
                            config=cfg).config
    _check(q_lat, q_rot, kv, k_rot, block_tables, context_lens, block_size, cfg)
    b, h, rank = q_lat.shape
    rope, dev = q_rot.shape[2], q_lat.device
    out = torch.empty(b, h, rank, dtype=q_lat.dtype, device=dev)  # [B, H, rank]
    if b == 0:
        return out
    head_blocks, splits = cdiv(h, cfg.block_h), cfg.num_splits
    dot, precision = dot_dtype(q_lat.dtype)
    final = splits == 1
    part = out if final else torch.empty(b, h, splits, rank, dtype=torch.float32, device=dev)  # [B, H, S, rank]
    lse = out if final else torch.empty(b, h, splits, dtype=torch.float32, device=dev)  # [B, H, S]
    _mla_split_kernel[(head_blocks, b, splits)](
        q_lat, q_rot, kv, k_rot, block_tables, context_lens, out, part, lse,
        q_lat.stride(0), q_lat.stride(1), q_rot.stride(0), q_rot.stride(1), kv.stride(0), k_rot.stride(0), block_tables.stride(0),
        out.stride(0), out.stride(1), part.stride(0), part.stride(1), 0 if final else part.stride(2), lse.stride(0), lse.stride(1),
        scale * LOG2E, block_size, splits, h,
        RANK=rank, ROPE=rope, BLOCK_R=pow2(rank), BLOCK_P=pow2(rope), BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        FINAL=final, DOT=dot, PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not final:
        merge_splits(part, lse, out)
    return out


TRITON = "interpreter" if interpreted() else "compiled"
select.register("triton", mla_decode, TRITON, available=available, priority=PRIORITY)
dispatch.register_map("mla_decode", select.mla_map)
