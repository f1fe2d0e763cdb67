"""Triton MLA decode: split-KV flash-decoding over the paged latent cache (weight-absorbed MLA).

Computes :func:`.mla.mla_decode` (layouts and numerics there): q_lat [B, H, rank], q_rot [B, H, rope]
against the cached latents kv [slots, rank] and rotated keys k_rot [slots, rope] -> o_lat [B, H, rank].

All heads of a sequence share one latent per token, so the latent is the key (with k_rot) and
the value at once: one program per (head block, sequence, kv split) loads a BLOCK_N-token chunk
of latents [BLOCK_N, rank] (gathered through the block table) once and uses it for BLOCK_H heads
in both dots, s = q_lat [BLOCK_H, rank] x c^T [rank, BLOCK_N] + q_rot x k_rot^T, and
acc += p [BLOCK_H, BLOCK_N] x c [BLOCK_N, rank] (FlashMLA, FlashInfer and SGLang's grouped decode
do the same).  The head blocks of one chunk are adjacent in the grid (axis 0), so the chunk is
read from HBM about once and from L2 by the other head blocks.  Online softmax in base 2 (the
scale folded into log2 e), float32 scores and accumulators.

Flash-decoding (Dao et al. 2023): with several splits each writes its normalised partial
o = acc / l and lse = m + log2 l (float32), and the sink-attention decode's merge kernel
(:func:`.attention_triton_decode.merge_splits`, no sink) combines them:
with M = max_s lse_s, out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M).  With one split
(large batches) the kernel writes the output directly.  The split count depends only on shapes
(B, H, block table width), never on the context lengths' values, so a decode step can be
captured in a CUDA graph.

DeepSeek-V3 size: rank 512, rope 64, H 128 (per tensor-parallel rank H / tp).  Default tiles
BLOCK_H 16, BLOCK_N 32: the accumulator [16, 512] float32 and one [32, 512] bf16 latent chunk
per pipeline stage; :class:`MLAConfig` keeps them parametrised (scripts/bench_mla.py sweeps
them).  In Triton's CPU interpreter dot operands are cast to float32 (see :mod:`.attention_triton`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..attention.prefill import LOG2E, check_operands, dot_dtype, paged_rows, pow2, softmax_step
from ..attention.decode import merge_splits, num_splits, split_range, write_split
from .mla_ref import check_mla
from ..triton_numerics import PRIORITY, available, cdiv, interpreted


@dataclass(frozen=True)
class MLAConfig:
    """Default: the fastest of scripts/bench_mla.py's sweep on the H200 at DeepSeek-V3 size (B=128,
    ctx 16384: 64/64/8 2.58 ms, 16/32/4 6.30 ms; it spills some registers, and still wins)."""

    block_h: int = 64  # heads per program (the M of both dots; >= 16 for tensor cores)
    block_n: int = 64  # tokens per latent chunk
    num_warps: int = 8
    num_stages: int = 2
    num_splits: int = 0  # 0: chosen from the SM count and the shapes

    def name(self) -> str:
        return f"h{self.block_h}/n{self.block_n}/w{self.num_warps}/st{self.num_stages}/s{self.num_splits or 'auto'}"


INTERPRETER_MLA = MLAConfig(16, 16, 1, 1)


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
        qk = tl.where(n_ok[None, :], qk, float("-inf"))  # offs_n[0] < hi: every row keeps a finite max
        acc, l_i, m_i = softmax_step(qk, c, acc, l_i, m_i, False, DOT, PRECISION)  # the latent chunk is also the value
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
    """Weight-absorbed MLA decode (see :func:`.mla.mla_decode`) -> o_lat [B, H, rank] in q_lat's dtype."""
    cfg = config or (INTERPRETER_MLA if interpreted() else MLAConfig())
    _check(q_lat, q_rot, kv, k_rot, block_tables, context_lens, block_size, cfg)
    b, h, rank = q_lat.shape
    rope, dev = q_rot.shape[2], q_lat.device
    out = torch.empty(b, h, rank, dtype=q_lat.dtype, device=dev)  # [B, H, rank]
    if b == 0:
        return out
    head_blocks = cdiv(h, cfg.block_h)
    splits = cfg.num_splits or num_splits(b, head_blocks, block_tables.shape[1] * block_size, cfg.block_n, dev)
    dot, precision = dot_dtype(q_lat.dtype)
    final = splits == 1
    # per-split o = acc / l and log2-sum-exp2; a single split writes the output directly
    part = out if final else torch.empty(b, h, splits, rank, dtype=torch.float32, device=dev)  # [B, H, S, rank]
    lse = out if final else torch.empty(b, h, splits, dtype=torch.float32, device=dev)  # [B, H, S]
    _mla_split_kernel[(head_blocks, b, splits)](
        q_lat, q_rot, kv, k_rot, block_tables, context_lens, out, part, lse,
        q_lat.stride(0), q_lat.stride(1), q_rot.stride(0), q_rot.stride(1), kv.stride(0), k_rot.stride(0), block_tables.stride(0),
        out.stride(0), out.stride(1), part.stride(0), part.stride(1), 0 if final else part.stride(2), lse.stride(0), lse.stride(1),
        scale * LOG2E, block_size, splits, h,
        RANK=rank, ROPE=rope, BLOCK_R=pow2(rank), BLOCK_P=pow2(rope), BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        FINAL=final, DOT=dot, PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if not final:
        merge_splits(part, lse, out)
    return out


dispatch.register("mla_decode", "triton", mla_decode, available=available, priority=PRIORITY)
