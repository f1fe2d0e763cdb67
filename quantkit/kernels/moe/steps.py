"""The K steps of the gathered-row kernel (:mod:`.fused_moe`): the promoted or upcast step, and MX experts'
transposed block-diagonal step."""

from __future__ import annotations

import triton
import triton.language as tl

from ..gemm.skinny import diag_act_tile, diag_promote, load_tile
from .common import moe_mma
from ..triton_numerics import e8m0_decode, e8m0_decode_lean


@triton.jit
def sub_scale(s_ptr, rows, row0, stride_r, kcol, n_cols, RPS: tl.constexpr, UNIFORM: tl.constexpr, E8M0: tl.constexpr):
    """Scales of one sub-block: a scalar when the tile's rows share a scale row, else per row."""
    if UNIFORM:
        s = tl.load(s_ptr + (row0 // RPS) * stride_r + kcol, mask=kcol < n_cols, other=0)
    else:
        s = tl.load(s_ptr + (rows // RPS) * stride_r + kcol, mask=(rows * 0 + kcol) < n_cols, other=0)
    if E8M0:
        s = e8m0_decode(s.to(tl.int32))
    return s


@triton.jit
def moe_step(acc_g, acc_u, kb, a_ptr, as_ptr, w_e, ws_e, a_row, a_ok, row_g, row_u, row0, up_off, K, AS_COLS, WS_COLS,
              s_am, s_asm, s_wn, s_wsn, GATED: tl.constexpr, A_KPS: tl.constexpr, A_E8M0: tl.constexpr,
              W_RPS: tl.constexpr, W_KPS: tl.constexpr, W_E8M0: tl.constexpr, W_UNIFORM: tl.constexpr,
              UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """One BLOCK_K-column block of K in SUB_K sub-blocks, each product promoted with both scales; padding rows load
    as zeros."""
    offs_k = tl.arange(0, SUB_K)
    for j in tl.static_range(BLOCK_K // SUB_K):
        ks = kb * BLOCK_K + j * SUB_K + offs_k
        a_ptrs = a_ptr + a_row[:, None] * s_am + ks[None, :]  # [BM, SUB_K]
        wg_ptrs = w_e + row_g[None, :] * s_wn + ks[:, None]  # [SUB_K, BN]
        if MASKED:
            a = tl.load(a_ptrs, mask=a_ok[:, None] & (ks < K)[None, :], other=0.0)
            wg = tl.load(wg_ptrs, mask=(ks < K)[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=a_ok[:, None], other=0.0)
            wg = tl.load(wg_ptrs)
        wcol = (kb * BLOCK_K + j * SUB_K) // W_KPS
        sa = sub_scale(as_ptr, a_row, 0, s_asm, (kb * BLOCK_K + j * SUB_K) // A_KPS, AS_COLS, 1, False, A_E8M0)
        sg = sub_scale(ws_e, row_g, row0, s_wsn, wcol, WS_COLS, W_RPS, W_UNIFORM, W_E8M0)
        acc_g = moe_mma(acc_g, a, wg, sa, sg, W_UNIFORM, UPCAST, UP_DTYPE)
        if GATED:
            wu_ptrs = w_e + row_u[None, :] * s_wn + ks[:, None]
            if MASKED:
                wu = tl.load(wu_ptrs, mask=(ks < K)[:, None], other=0.0)
            else:
                wu = tl.load(wu_ptrs)
            su = sub_scale(ws_e, row_u, row0 + up_off, s_wsn, wcol, WS_COLS, W_RPS, W_UNIFORM, W_E8M0)
            acc_u = moe_mma(acc_u, a, wu, sa, su, W_UNIFORM, UPCAST, UP_DTYPE)
    return acc_g, acc_u


@triton.jit
def _diag_weight(w_e, ws_e, rows, k, K, gcol, WS_COLS, s_wn, s_wsn, MASKED: tl.constexpr):
    """E4M3 weight rows [BN, BLOCK_K] (zeros past K) and their E8M0 scales [BN, G]."""
    w = load_tile(w_e + rows[:, None] * s_wn + k[None, :], k < K, rows, False, MASKED, False)
    s = e8m0_decode_lean(tl.load(ws_e + rows[:, None] * s_wsn + gcol[None, :], mask=(gcol < WS_COLS)[None, :], other=127))
    return w, s


@triton.jit
def moe_step_diag(acc_g, acc_u, kb, a_ptr, as_ptr, w_e, ws_e, a_row, a_ok, row_g, row_u, K, AS_COLS, WS_COLS,
                   s_am, s_asm, s_wn, s_wsn, GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                   SUB_K: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """:func:`moe_step` for MX experts, transposed (acc [BN, BM]): one fp8 dot per 128 columns on a block-diagonal
    activation tile gives the four 32-column products side by side, each promoted with its E8M0 scales."""
    G: tl.constexpr = BLOCK_K // SUB_K
    k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    a = diag_act_tile(a_ptr, a_row, a_ok, k, K, s_am, BLOCK_M, BLOCK_K, SUB_K, MASKED, True)  # [BLOCK_K, G * BM]
    gcol = kb * G + tl.arange(0, G)
    sa = e8m0_decode_lean(tl.load(as_ptr + a_row[None, :] * s_asm + gcol[:, None], mask=(gcol < AS_COLS)[:, None], other=127))  # [G, BM]
    wg, sg = _diag_weight(w_e, ws_e, row_g, k, K, gcol, WS_COLS, s_wn, s_wsn, MASKED)
    acc_g = diag_promote(acc_g, tl.dot(wg, a), sg, sa)
    if GATED:
        wu, su = _diag_weight(w_e, ws_e, row_u, k, K, gcol, WS_COLS, s_wn, s_wsn, MASKED)
        acc_u = diag_promote(acc_u, tl.dot(wu, a), su, sa)
    return acc_g, acc_u


@triton.jit
def moe_kernel_step(acc_g, acc_u, kb, a_ptr, as_ptr, w_e, ws_e, a_row, a_ok, row_g, row_u, row0, up_off, K, AS_COLS, WS_COLS,
                     s_am, s_asm, s_wn, s_wsn, GATED: tl.constexpr, A_KPS: tl.constexpr, A_E8M0: tl.constexpr, W_RPS: tl.constexpr,
                     W_KPS: tl.constexpr, W_E8M0: tl.constexpr, W_UNIFORM: tl.constexpr, UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, MASKED: tl.constexpr, DIAG: tl.constexpr):  # fmt: skip
    """One K-block: the block-diagonal step (DIAG) or the promoted / upcast one."""
    if DIAG:  # an else, not an early return: Triton compiles what follows a return, and the shapes differ
        acc_g, acc_u = moe_step_diag(acc_g, acc_u, kb, a_ptr, as_ptr, w_e, ws_e, a_row, a_ok, row_g, row_u, K, AS_COLS, WS_COLS,
                                      s_am, s_asm, s_wn, s_wsn, GATED, BLOCK_M, BLOCK_K, SUB_K, MASKED)  # fmt: skip
    else:
        acc_g, acc_u = moe_step(acc_g, acc_u, kb, a_ptr, as_ptr, w_e, ws_e, a_row, a_ok, row_g, row_u, row0, up_off, K, AS_COLS, WS_COLS,
                                 s_am, s_asm, s_wn, s_wsn, GATED, A_KPS, A_E8M0, W_RPS, W_KPS, W_E8M0, W_UNIFORM, UPCAST, UP_DTYPE,
                                 BLOCK_K, SUB_K, MASKED)  # fmt: skip
    return acc_g, acc_u
