"""Fused MoE on expert-sorted rows (leaves ``triton.sorted`` and ``triton.sorted_wgmma``; DeepGEMM's contiguous
grouped layout).  The quantized token rows are gathered once into ``sorted_ids`` order, A [cap, H] with one expert
per BLOCK_M rows, so both GEMMs read dense TMA tiles; GEMM 1 writes [cap, I] in sorted order, GEMM 2 stores row r
to slot ``sorted_ids[r]``.  FP8-block steps 128 K columns with per-128 promotion (one weight scale per tile: see
:func:`.select.sorted_why_not`); MXFP8 steps 32, 64 or 128 columns on bf16-exact upcast operands.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ...formats import mxfp8
from .fused_moe_ref import ExpertWeights, MoeSpec
from ..dispatch import sm_count
from ..gemm.block_scaled import tile_coords
from .common import add_bias, moe_activation, moe_mma
from .routing import Alignment
from ..triton_numerics import bf16_round, cdiv, e8m0_decode, interpreted, times_group_scales

BLOCK_K = 128


@triton.jit
def _mx_upcast(x, s_ptr, rows, rows_ok, stride_r, kb, n_cols, SUB_K: tl.constexpr, UP_DTYPE: tl.constexpr):
    """E4M3 [R, SUB_K] times its E8M0 scales (one per 32 columns of a row), exact in UP_DTYPE."""
    G: tl.constexpr = SUB_K // 32
    cols = kb * G + tl.arange(0, G)
    s = tl.load(s_ptr + rows[:, None] * stride_r + cols[None, :], mask=rows_ok[:, None] & (cols < n_cols)[None, :], other=0)
    return times_group_scales(x.to(tl.float32), e8m0_decode(s.to(tl.int32)), 32).to(UP_DTYPE)  # s [R, G]


@triton.jit
def _weight_step(acc, a, sa, w_desc, e, wrow, k0, ws_e, s_wsn, kcol, N_W, WS_COLS, ROWS: tl.constexpr, SUB_K: tl.constexpr,
                 MX: tl.constexpr, UP_DTYPE: tl.constexpr):  # fmt: skip
    """acc += (a * sa) @ (w[e, wrow:wrow+ROWS, k0:k0+SUB_K] * its scales).T: FP8-block, one scale per tile (promoted
    dot); MX, upcast operands (32-column steps: moe_mma's; longer ones: ``a`` arrives upcast)."""
    w = w_desc.load([e, wrow, k0]).reshape(ROWS, SUB_K)
    if MX and SUB_K == 32:  # one E8M0 scale per row
        wr = wrow + tl.arange(0, ROWS)
        sw = e8m0_decode(tl.load(ws_e + wr * s_wsn + kcol, mask=wr < N_W, other=0).to(tl.int32))
        acc = moe_mma(acc, a, w.T, sa, sw, False, True, UP_DTYPE)
    elif MX:  # ``a`` already upcast
        wr = wrow + tl.arange(0, ROWS)
        wb = _mx_upcast(w, ws_e, wr, wr < N_W, s_wsn, kcol, WS_COLS, SUB_K, UP_DTYPE)
        acc = tl.dot(a, wb.T, acc)
    else:
        sw = tl.load(ws_e + (wrow // SUB_K) * s_wsn + kcol)
        acc = moe_mma(acc, a, w.T, sa, sw, True, False, UP_DTYPE)
    return acc


@triton.jit
def _sorted_gemm_kernel(
    a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr,
    n_slots, CAP, N, K, N_W, up_off, alpha, limit, s_asm, s_wse, s_wsn, s_be, s_om, S_COLS,
    MX: tl.constexpr, SUB_K: tl.constexpr, UP_DTYPE: tl.constexpr, GATED: tl.constexpr, PAIRED: tl.constexpr, W_ROWS: tl.constexpr, ACT: tl.constexpr, ROUND: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCATTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Rows [r0, r0 + BLOCK_M) of the sorted activations (one expert) x BLOCK_N output columns.  PAIRED: interleaved
    gate/up in one W_ROWS = 2 x BLOCK_N tile; SCATTER: row r is stored at slot sorted_ids[r]."""
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
    for kb in range(tl.cdiv(K, SUB_K)):
        k0 = kb * SUB_K
        a = a_desc.load([r0, k0])  # [BM, SUB_K]; K past the end arrives as zeros
        if MX and SUB_K > 32:  # upcast once per step, shared by gate and up
            sa = 0.0
            a = _mx_upcast(a, as_ptr, rows, rows < CAP, s_asm, kb, S_COLS, SUB_K, UP_DTYPE)
        else:
            sa = tl.load(as_ptr + rows * s_asm + kb)
            if MX:
                sa = e8m0_decode(sa.to(tl.int32))
        acc = _weight_step(acc, a, sa, w_desc, e, wrow, k0, ws_e, s_wsn, kb, N_W, S_COLS, W_ROWS, SUB_K, MX, UP_DTYPE)
        if GATED and not PAIRED:
            acc_u = _weight_step(acc_u, a, sa, w_desc, e, up_off + n0, k0, ws_e, s_wsn, kb, N_W, S_COLS, BLOCK_N, SUB_K, MX, UP_DTYPE)
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


def gather_rows(a: torch.Tensor, sa: torch.Tensor, al: Alignment, n_slots: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token E4M3 [T, H] and scales [T, G] in ``sorted_ids`` order: [cap, H], [cap, G]."""
    src = torch.where(al.sorted_ids < n_slots, al.sorted_ids // top_k, 0).to(torch.int64)
    return a.view(torch.uint8).index_select(0, src).view(a.dtype), sa.index_select(0, src)


def sorted_gemm(a: torch.Tensor, sa: torch.Tensor, w: ExpertWeights, out: torch.Tensor, al: Alignment, n_slots: int,
                spec: MoeSpec, gated: bool, block_n: int, act: int, num_warps: int, num_stages: int, group_m: int, mx_step: int = 32) -> None:  # fmt: skip
    """One grouped GEMM over sorted rows: GEMM 1 (gated, [cap, I] in sorted order) or GEMM 2 (rows scattered to
    their slots in ``out`` [T*k, H])."""
    e, nw, k = w.q.shape
    n_out = nw // 2 if gated else nw
    cap, bm = al.sorted_ids.shape[0], al.block_m
    interleaved = gated and spec.interleaved
    rows = 2 * block_n if interleaved else block_n
    mx = w.format.weight_scale.e8m0  # 1x32 E8M0 scales (else 128x128 F32 tiles)
    assert mx_step in (32, 64, 128), f"MX steps of 32, 64 or 128 columns, got {mx_step}"
    sub_k = mx_step if mx else BLOCK_K
    ws = w.scale.view(torch.uint8) if mx else w.scale
    a_desc = TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [bm, sub_k])
    w_desc = TensorDescriptor(w.q, [e, nw, k], list(w.q.stride()), [1, rows, sub_k])
    bias = w.bias if w.bias is not None else out
    tiles = cdiv(cap, bm) * cdiv(n_out, block_n)
    _sorted_gemm_kernel[(tiles,)](
        a_desc, sa.view(torch.uint8) if mx else sa, w_desc, ws, bias, out, al.sorted_ids, al.expert_ids, al.num_padded,
        n_slots, cap, n_out, k, nw, n_out if gated and not interleaved else 0, spec.alpha, spec.limit,
        sa.stride(0), ws.stride(0), ws.stride(1), bias.stride(0), out.stride(0), k // mxfp8.BLOCK,
        MX=mx, SUB_K=sub_k, UP_DTYPE=tl.float32 if interpreted() else tl.bfloat16, GATED=gated, PAIRED=interleaved, W_ROWS=rows, ACT=act, ROUND=out.dtype == torch.bfloat16, HAS_BIAS=w.bias is not None,
        SCATTER=not gated, BLOCK_M=bm, BLOCK_N=block_n, GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


WGMMA_BLOCK_MS = (64, 128)  # the wgmma kernel's expert blocks (64: both warpgroups on every row, split N)


def sorted_gemm_wgmma(a: torch.Tensor, sa: torch.Tensor, w: ExpertWeights, out: torch.Tensor, al: Alignment, n_slots: int,
                      spec: MoeSpec, gated: bool, act: int, stages: int, group_m: int) -> None:  # fmt: skip
    """:func:`sorted_gemm` (FP8-block) on the warp-specialised Gluon kernel (:func:`.wgmma_gluon.moe_gemm_ws`), same
    products and epilogue; :func:`.select.wgmma_why_not` must have passed."""
    from ..gemm import wgmma as gemm_wgmma
    from . import wgmma_gluon

    e, nw, k = w.q.shape
    n_out = nw // 2 if gated else nw
    halves = gated and not spec.interleaved
    cap, bm = al.sorted_ids.shape[0], al.block_m
    assert bm in WGMMA_BLOCK_MS, f"expert blocks of {WGMMA_BLOCK_MS} rows, got {bm}"
    assert sa.dtype == torch.float32 and sa.stride(1) == 1, f"F32 activation scales with contiguous columns, got {sa.dtype} {sa.stride()}"
    split = bm == 64
    bn_wg = 64 if gated else 128
    a_desc = gemm_wgmma.descriptor(a, bm, BLOCK_K)
    w_desc = gemm_wgmma.descriptor(w.q.view(e * nw, k), 64 if halves else 256 if split else 128, BLOCK_K)  # expert e's rows start at e * nw
    bias = w.bias if w.bias is not None else out
    ws = w.scale
    tiles = cdiv(cap, bm) * cdiv(n_out, bn_wg * (2 if split else 1))
    grid = (min(tiles, sm_count(out.device)),)
    wgmma_gluon.moe_gemm_ws[grid](
        a_desc, w_desc, sa, ws, bias, out, al.sorted_ids, al.expert_ids, al.num_padded, n_slots, cap, n_out, nw, k,
        n_out if halves else 0, spec.alpha, spec.limit, sa.stride(0), ws.stride(0), ws.stride(1), ws.stride(2), bias.stride(0), out.stride(0),
        BM=bm, BN_WG=bn_wg, BK=BLOCK_K, STAGES=stages, UNROLL=2 if halves else 4, GROUP=group_m,
        REGS=gemm_wgmma.CONSUMER_REGS, LOADER_REGS=gemm_wgmma.LOADER_REGS, GATED=gated, HALVES=halves, HAS_BIAS=w.bias is not None,
        ROUND=out.dtype == torch.bfloat16, ACT=act, SPLIT_N=split, num_warps=4,
    )  # fmt: skip
