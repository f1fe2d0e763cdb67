"""Fused MoE for many tokens (prefill), FP8-block experts: expert-sorted activations through TMA.

The gathered-row kernel of :mod:`.fused_moe` loads each block's token rows by pointer (a
row gather), which keeps its tiles small.  Here the rows are put in expert order once, so both
GEMMs read dense tiles through TMA descriptors, as a dense GEMM does (DeepGEMM's "contiguous"
grouped layout; vLLM's ``moe_permute`` + grouped GEMM):

1. x [T, H] is quantized once per token (1x128, :mod:`.group_quant`) and its rows and scales
   gathered into ``sorted_ids`` order: row r holds token ``sorted_ids[r] // k`` (padding rows
   re-read token 0 and are never stored) -> A [cap, H], one expert per BLOCK_M rows;
2. GEMM 1: A x the block's expert's gate and up rows (a rank-3 descriptor over [E, 2I, H]:
   rows past an expert's end arrive as zeros), DeepSeek's per-128 promotion, bias, x.dtype
   rounding and the activation in the epilogue, written in sorted order -> [cap, I];
   interleaved gate/up (GPT-OSS: rows 2j, 2j+1) is one dot over 2 x BLOCK_N rows whose
   columns are split in the epilogue; concatenated gate/up (rows j, I + j) two dots;
3. the intermediate is quantized per row (1x128) and GEMM 2 (down [E, H, I]) reads it as
   dense rows again, storing row r to slot ``sorted_ids[r]`` -> [T*k, H];
4. the combine of :mod:`.fused_moe` (fixed order, no atomics).

Same numerics as the gathered-row kernel (same bytes in, same per-128 promotion, same
epilogue): the outputs differ by float32 summation order only.  Weight scales must be uniform
over a tile (one 128-row scale block): BLOCK_N divides 128 (2 x BLOCK_N for interleaved
gate/up) and, for concatenated gate/up, I is a multiple of 128 -- :func:`sorted_ok` says.
Blocks past ``num_padded`` return at once and the rows they would read are never gathered, so
nothing here depends on the routing on the host (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .fused_moe_ref import ExpertWeights, MoeSpec
from .gemm_block_scaled import tile_coords
from .moe_epilogue import add_bias, moe_activation
from .moe_routing import Alignment
from .triton_numerics import bf16_round

BLOCK_K = 128


@triton.jit
def _promoted(acc, a, w_desc, e, wrow, k0, sa, ws_e, s_wsn, kb, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += (a @ w[e, wrow:wrow+ROWS, k0:k0+128].T) * sa[:, None] * (the tile's weight scale)."""
    w = w_desc.load([e, wrow, k0]).reshape(ROWS, BLOCK_K)
    sw = tl.load(ws_e + (wrow // BLOCK_K) * s_wsn + kb)
    return acc + tl.dot(a, w.T) * (sa * sw)[:, None]


@triton.jit
def _sorted_gemm_kernel(
    a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr,
    n_slots, CAP, N, K, up_off, alpha, limit, s_asm, s_wse, s_wsn, s_be, s_om,
    GATED: tl.constexpr, PAIRED: tl.constexpr, W_ROWS: tl.constexpr, ACT: tl.constexpr, ROUND: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCATTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Rows [r0, r0 + BLOCK_M) of the sorted activations (one expert) x BLOCK_N output columns.
    GATED: the activation of gate and up (PAIRED: interleaved, one W_ROWS = 2 x BLOCK_N tile);
    SCATTER: row r is stored at slot sorted_ids[r]."""
    pid_m, pid_n = tile_coords(tl.program_id(0), CAP, N, BLOCK_M, BLOCK_N, GROUP_M)
    r0 = pid_m * BLOCK_M
    if r0 >= tl.load(npad_ptr):
        return
    e = tl.load(expert_ptr + pid_m)
    rows = r0 + tl.arange(0, BLOCK_M)
    n0 = pid_n * BLOCK_N
    ws_e = ws_ptr + e.to(tl.int64) * s_wse
    acc = tl.zeros((BLOCK_M, W_ROWS), dtype=tl.float32)  # PAIRED: interleaved gate/up, W_ROWS = 2 x BLOCK_N
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    wrow = n0
    if PAIRED:
        wrow = 2 * n0
    for kb in range(tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        a = a_desc.load([r0, k0])  # [BM, 128]; K past the end arrives as zeros
        sa = tl.load(as_ptr + rows * s_asm + kb)
        acc = _promoted(acc, a, w_desc, e, wrow, k0, sa, ws_e, s_wsn, kb, W_ROWS, BLOCK_K)
        if GATED and not PAIRED:
            acc_u = _promoted(acc_u, a, w_desc, e, up_off + n0, k0, sa, ws_e, s_wsn, kb, BLOCK_N, BLOCK_K)
    cols = n0 + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    bias_e = bias_ptr + e.to(tl.int64) * s_be
    if GATED:
        if PAIRED:  # columns 2j, 2j + 1: gate and up of intermediate column n0 + j
            g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
            row_g = 2 * cols
            row_u = row_g + 1
        else:
            g, u = acc, acc_u
            row_g = cols
            row_u = cols + up_off
        h = bf16_round(add_bias(g, bias_e, row_g, col_ok, HAS_BIAS), ROUND)
        u = bf16_round(add_bias(u, bias_e, row_u, col_ok, HAS_BIAS), ROUND)
        h = moe_activation(h, u, ACT, alpha, limit, ROUND)
    else:
        h = bf16_round(add_bias(acc, bias_e, cols, col_ok, HAS_BIAS), ROUND)
    if SCATTER:
        slot = tl.load(sorted_ptr + rows)
        ok = slot < n_slots
        out_rows = tl.where(ok, slot, 0).to(tl.int64)
    else:
        ok = rows < CAP
        out_rows = rows.to(tl.int64)
    tl.store(out_ptr + out_rows[:, None] * s_om + cols[None, :], h.to(out_ptr.dtype.element_ty), mask=ok[:, None] & col_ok[None, :])


def sorted_ok(w13: ExpertWeights, w2: ExpertWeights, spec: MoeSpec, block_n1: int, block_n2: int) -> bool:
    """Whether the sorted path takes these experts: fp8-block, 16-byte rows (TMA), and every
    weight tile under one scale block (see the module docstring)."""
    inter, h = w2.q.shape[2], w2.q.shape[1]
    rows1 = 2 * block_n1 if spec.interleaved else block_n1
    return (
        w13.fmt == w2.fmt == "fp8-block"
        and BLOCK_K % rows1 == 0
        and BLOCK_K % block_n2 == 0
        and (spec.interleaved or inter % BLOCK_K == 0)
        and h % 16 == 0
        and inter % 16 == 0
        and all(w.q.is_contiguous() and w.q.data_ptr() % 16 == 0 for w in (w13, w2))
    )


def gather_rows(a: torch.Tensor, sa: torch.Tensor, al: Alignment, n_slots: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the per-token E4M3 [T, H] and scales [T, G] in ``sorted_ids`` order: [cap, H], [cap, G]."""
    src = torch.where(al.sorted_ids < n_slots, al.sorted_ids // top_k, 0).to(torch.int64)
    return a.view(torch.uint8).index_select(0, src).view(a.dtype), sa.index_select(0, src)


def sorted_gemm(a: torch.Tensor, sa: torch.Tensor, w: ExpertWeights, out: torch.Tensor, al: Alignment, n_slots: int,
                spec: MoeSpec, gated: bool, block_n: int, act: int, num_warps: int, num_stages: int, group_m: int) -> None:  # fmt: skip
    """One grouped GEMM over sorted rows: GEMM 1 (gated, writes [cap, I] in sorted order) or
    GEMM 2 (scatters [cap, H] rows to their slots in ``out`` [T*k, H])."""
    e, nw, k = w.q.shape
    n_out = nw // 2 if gated else nw
    cap, bm = al.sorted_ids.shape[0], al.block_m
    interleaved = gated and spec.interleaved
    rows = 2 * block_n if interleaved else block_n
    a_desc = TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [bm, BLOCK_K])
    w_desc = TensorDescriptor(w.q, [e, nw, k], list(w.q.stride()), [1, rows, BLOCK_K])
    bias = w.bias if w.bias is not None else out
    tiles = triton.cdiv(cap, bm) * triton.cdiv(n_out, block_n)
    _sorted_gemm_kernel[(tiles,)](
        a_desc, sa, w_desc, w.scale, bias, out, al.sorted_ids, al.expert_ids, al.num_padded,
        n_slots, cap, n_out, k, n_out if gated and not interleaved else 0, spec.alpha, spec.limit,
        sa.stride(0), w.scale.stride(0), w.scale.stride(1), bias.stride(0), out.stride(0),
        GATED=gated, PAIRED=interleaved, W_ROWS=rows, ACT=act, ROUND=out.dtype == torch.bfloat16, HAS_BIAS=w.bias is not None,
        SCATTER=not gated, BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=BLOCK_K, GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
