"""Triton fused MoE (vLLM fused_moe style): the ``triton`` backend of ``fused_moe`` (contract and numerics:
:mod:`.fused_moe_ref`; leaf and tiles: :mod:`.select`).  No host sync; buffers sized by the shapes (CUDA-graph safe).

1. x [T, H] is quantized once per token; 2. :func:`.routing.align` sorts the T*k (token, slot) pairs by expert
into BLOCK_M-row blocks; 3. GEMM 1 (gate and up) with bias, x.dtype rounding and the activation -> [T*k, I];
4. the intermediate is quantized like x, GEMM 2 -> [T*k, H]; 5. :func:`_combine_kernel` sums each token's k rows
in fixed order (no atomics: the same bytes on every run).  GEMMs 1 and 2 read token rows gathered by pointer
(``triton.moe_steps``, here) or put in expert order once (:mod:`.sorted_tokens`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
import triton
import triton.language as tl

from ... import formats
from .. import dispatch
from ..dispatch import Choice
from ..gemm.block_scaled import WORKSPACE, split_reduce_pair, tile_coords
from ..quant.group_quant import act_quant_fp8_block, mxfp8_quantize
from ..triton_numerics import PRIORITY, available, bf16_round, cdiv, interpreted, next_pow2, pdl_enter
from .common import add_bias, moe_activation
from .fused_moe_ref import ExpertWeights, MoeSpec
from .routing import Alignment, align
from .select import kernel_map, select_call
from .sorted_tokens import gather_rows, sorted_gemm, sorted_gemm_wgmma
from .steps import moe_kernel_step
from .tables import BLOCK_K, MoeConfig

INT32_LIMIT = 2**31
ACT_CODES = {"silu": 0, "gpt-oss": 1}


@triton.jit(do_not_specialize=["n_slots", "up_off", "EM", "kb_per_split"])
def _moe_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr, part_ptr, count_ptr,
    n_slots, EM, N, K, up_off, AS_COLS, WS_COLS, alpha, limit, kb_per_split,
    s_am, s_asm, s_we, s_wn, s_wse, s_wsn, s_be, s_om,
    TOP_K: tl.constexpr, GATED: tl.constexpr, ROW_STEP: tl.constexpr, ACT: tl.constexpr, ROUND: tl.constexpr,
    A_KPS: tl.constexpr, A_E8M0: tl.constexpr, W_RPS: tl.constexpr, W_KPS: tl.constexpr, W_E8M0: tl.constexpr,
    W_UNIFORM: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_SPLIT: tl.constexpr, DIAG: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """out[slot, :N] for one BLOCK_M block of slots (one expert) and BLOCK_N output columns; program_id(1) picks the
    split of K (``kb_per_split`` BLOCK_K-column blocks each).  DIAG: the transposed product of :func:`.steps.moe_step_diag`."""
    pdl_enter(PDL)
    pid_m, pid_n = tile_coords(tl.program_id(0), EM, N, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    slot = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]; n_slots = padding
    valid = slot < n_slots
    a_row = tl.where(valid, slot // TOP_K, 0)  # padding rows: not read (masked), never stored
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_g = (offs_n % N) * ROW_STEP  # weight rows of the gate (or only) half; wrapped columns never stored
    row_u = row_g + up_off
    row0 = pid_n * BLOCK_N * ROW_STEP
    w_e = w_ptr + e * s_we
    ws_e = ws_ptr + e * s_wse
    n_full = K // BLOCK_K  # full K-blocks run unmasked; the partial last one (GPT-OSS's 2880) masked
    kb_lo = tl.program_id(1) * kb_per_split
    kb_hi = tl.minimum(kb_lo + kb_per_split, tl.cdiv(K, BLOCK_K))
    ACC_R: tl.constexpr = BLOCK_N if DIAG else BLOCK_M  # DIAG takes the product transposed: weight rows x slots
    ACC_C: tl.constexpr = BLOCK_M if DIAG else BLOCK_N
    acc_g = tl.zeros((ACC_R, ACC_C), dtype=tl.float32)
    acc_u = tl.zeros((ACC_R, ACC_C), dtype=tl.float32)
    for kb in range(kb_lo, tl.minimum(kb_hi, n_full)):
        acc_g, acc_u = moe_kernel_step(acc_g, acc_u, kb, a_ptr, as_ptr, w_e, ws_e, a_row, valid, row_g, row_u, row0, up_off, K, AS_COLS, WS_COLS,
                                        s_am, s_asm, s_wn, s_wsn, GATED, A_KPS, A_E8M0, W_RPS, W_KPS, W_E8M0, W_UNIFORM, UPCAST, UP_DTYPE,
                                        BLOCK_M, BLOCK_K, SUB_K, False, DIAG)  # fmt: skip
    if (kb_hi > n_full) & (kb_lo <= n_full):  # this split holds the partial last block
        acc_g, acc_u = moe_kernel_step(acc_g, acc_u, n_full, a_ptr, as_ptr, w_e, ws_e, a_row, valid, row_g, row_u, row0, up_off, K, AS_COLS, WS_COLS,
                                        s_am, s_asm, s_wn, s_wsn, GATED, A_KPS, A_E8M0, W_RPS, W_KPS, W_E8M0, W_UNIFORM, UPCAST, UP_DTYPE,
                                        BLOCK_M, BLOCK_K, SUB_K, True, DIAG)  # fmt: skip
    if DIAG:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)

    if HAS_SPLIT:
        last, acc_g, acc_u = split_reduce_pair(acc_g, acc_u, part_ptr, count_ptr, tl.program_id(0), tl.num_programs(0),
                                                tl.program_id(1), tl.num_programs(1), GATED, BLOCK_M, BLOCK_N)  # fmt: skip
        if not last:
            return
    col_ok = offs_n < N
    h = bf16_round(add_bias(acc_g, bias_ptr + e * s_be, row_g, col_ok, HAS_BIAS), ROUND)
    if GATED:
        u = bf16_round(add_bias(acc_u, bias_ptr + e * s_be, row_u, col_ok, HAS_BIAS), ROUND)
        h = moe_activation(h, u, ACT, alpha, limit, ROUND)
    out_ptrs = out_ptr + slot[:, None].to(tl.int64) * s_om + offs_n[None, :]
    tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _combine_kernel(y_ptr, w_ptr, out_ptr, H, TOP_K: tl.constexpr, ROUND: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    """out[t] = sum_j float32(y[t*k + j]) * w[t, j], j in order; y [T*k, H], w float32 [T, k]."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        wj = tl.load(w_ptr + t * TOP_K + j)
        acc += tl.load(y_ptr + (t * TOP_K + j) * H + offs, mask=mask, other=0.0).to(tl.float32) * wj
    tl.store(out_ptr + t * H + offs, bf16_round(acc, ROUND).to(out_ptr.dtype.element_ty), mask=mask)


def _quant(x: torch.Tensor, fmt: str, spec: MoeSpec, pdl: bool = False, live_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 [R, K], F32 [R, ceil(K/128)] or U8 [R, K/32]); rows at or past ``live_rows`` quantize as zeros."""
    if formats.get(fmt).act_scale.e8m0:  # 1x32 E8M0 (MX)
        return mxfp8_quantize(x, spec.rule, pdl=pdl, live_rows=live_rows)
    return act_quant_fp8_block(x, spec.scale_fmt, spec.rule, pdl=pdl, live_rows=live_rows)


def _gemm(a: torch.Tensor, sa: torch.Tensor, w: ExpertWeights, out: torch.Tensor, al: Alignment, n_slots: int,
          top_k: int, spec: MoeSpec, gated: bool, block_n: int, cfg: MoeConfig) -> None:  # fmt: skip
    """One grouped GEMM on gathered rows: GEMM 1 (gated, with the activation) or GEMM 2."""
    _, nw, k = w.shape
    n_out = nw // 2 if gated else nw
    wg, ag = w.format.weight_scale, w.format.act_scale  # the scale grids: 128x128 F32 tiles (fp8b) or 1x32 E8M0 (MX)
    fp8b = not wg.e8m0
    ws = w.scale.view(torch.uint8) if wg.e8m0 else w.scale
    assert a.shape[1] == k and sa.is_contiguous() and ws.is_contiguous() and w.q.stride(2) == 1 and a.stride(1) == 1, "fused_moe: layouts"
    assert out.shape == (n_slots, n_out) and out.is_contiguous(), f"fused_moe: output {tuple(out.shape)}, want ({n_slots}, {n_out})"
    assert max(a.numel(), w.q[0].numel(), out.numel()) < INT32_LIMIT, "fused_moe: 32-bit offsets overflow"
    assert not (cfg.upcast and fp8b) and not (cfg.diag and (fp8b or cfg.upcast)), f"{cfg.name()}: upcast and diag are MX-only, and exclusive"
    assert cfg.diag or al.block_m >= 16, f"{cfg.name()}: the tensor-core dot needs 16-row blocks (fewer only with diag)"
    assert cfg.block_k in (BLOCK_K, 2 * BLOCK_K) and (fp8b or cfg.block_k == BLOCK_K), f"{cfg.name()}: block_k 128, or 256 (FP8-block)"
    interleaved = gated and spec.interleaved
    row_step, up_off = (2, 1) if interleaved else (1, n_out if gated else 0)
    # one weight scale row per tile (gate and up alike): a scalar scale load and promotion
    uniform = fp8b and wg.rows % (block_n * row_step) == 0 and up_off % (1 if interleaved else wg.rows) == 0
    bias = w.bias if w.bias is not None else out
    cap = al.sorted_ids.shape[0]
    tiles = cdiv(cap, al.block_m) * cdiv(n_out, block_n)
    split, per = moe_split(cfg, tiles, n_slots, n_out, block_n, k, out.device, cfg.block_k)
    part, count = (out, out)
    if split > 1:
        part = WORKSPACE.partials(split * tiles * al.block_m * block_n * (2 if gated else 1), out.device)
        count = WORKSPACE.counters(tiles, out.device)
    _moe_gemm_kernel[(tiles, split)](
        a, sa, w.q, ws, bias, out, al.sorted_ids, al.expert_ids, al.num_padded, part, count,
        n_slots, cap, n_out, k, up_off, sa.shape[1], ws.shape[2], spec.alpha, spec.limit, per,
        a.stride(0), sa.stride(0), w.q.stride(0), w.q.stride(1), ws.stride(0), ws.stride(1), bias.stride(0), out.stride(0),
        TOP_K=top_k, GATED=gated, ROW_STEP=row_step, ACT=ACT_CODES[spec.activation] if gated else 0,
        ROUND=out.dtype == torch.bfloat16, A_KPS=ag.cols, A_E8M0=sa.dtype == torch.uint8,
        W_RPS=wg.rows, W_KPS=wg.cols, W_E8M0=wg.e8m0, W_UNIFORM=uniform, HAS_BIAS=w.bias is not None,
        UPCAST=cfg.upcast, UP_DTYPE=tl.float32 if interpreted() else tl.bfloat16,
        BLOCK_M=al.block_m, BLOCK_N=block_n, BLOCK_K=cfg.block_k, SUB_K=wg.cols,
        GROUP_M=cfg.group_m, HAS_SPLIT=split > 1, DIAG=cfg.diag, PDL=cfg.pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        launch_pdl=cfg.pdl,
    )  # fmt: skip


def moe_split(cfg: MoeConfig, tiles: int, n_pairs: int, n_out: int, block_n: int, k: int, device: torch.device,
              block_k: int = BLOCK_K) -> tuple[int, int]:  # fmt: skip
    """(K splits, ``block_k`` blocks per split): K is split until the busy programs give every SM ``cfg.waves``, at
    least 2 K-blocks a split; partial sums are reduced in split order (deterministic)."""
    n_kb = cdiv(k, block_k)
    busy = min(tiles // cdiv(n_out, block_n), n_pairs) * cdiv(n_out, block_n)
    want = max(1, min(cdiv(cfg.waves * dispatch.sm_count(device), max(busy, 1)), n_kb // 2))
    per = cdiv(n_kb, max(1, min(want, n_kb)))
    return cdiv(n_kb, per), per


def _gathered(x, w13, w2, spec, al, k, cfg, y, x_q) -> None:
    """``triton.moe_steps``: both GEMMs on gathered token rows -> y [T*k, H]."""
    n, inter = y.shape[0], w2.q.shape[2]
    a, sa = _quant(x, w13.fmt, spec, cfg.pdl) if x_q is None else x_q  # once per token: E4M3 [T, H]
    mid = torch.empty((n, inter), dtype=x.dtype, device=x.device)  # [T*k, I], slot order
    _gemm(a, sa, w13, mid, al, n, k, spec, True, cfg.block_n1, cfg)
    mq, ms = _quant(mid, w13.fmt, spec, cfg.pdl)
    _gemm(mq, ms, w2, y, al, n, 1, spec, False, cfg.block_n2, cfg)


def _sorted(x, w13, w2, spec, al, k, cfg, y, x_q, wgmma: bool = False) -> None:
    """``triton.sorted`` (``wgmma``: ``triton.sorted_wgmma``): both GEMMs on expert-sorted rows -> y [T*k, H]."""
    n, inter = y.shape[0], w2.q.shape[2]
    a, sa = gather_rows(*(_quant(x, w13.fmt, spec) if x_q is None else x_q), al, n, k)  # [cap, H] in sorted order
    # [cap, I], sorted order: GEMM 1 writes rows below num_padded only, and its quantizer reads no further
    mid = torch.empty((al.sorted_ids.shape[0], inter), dtype=x.dtype, device=x.device)
    act = ACT_CODES[spec.activation]
    if wgmma:
        sorted_gemm_wgmma(a, sa, w13, mid, al, n, spec, True, act, cfg.num_stages, cfg.group_m)
        mq, ms = _quant(mid, w13.fmt, spec, live_rows=al.num_padded)
        sorted_gemm_wgmma(mq, ms, w2, y, al, n, spec, False, 0, cfg.num_stages, cfg.group_m)
        return
    launch = (cfg.num_warps, cfg.num_stages, cfg.group_m, cfg.mx_step)
    sorted_gemm(a, sa, w13, mid, al, n, spec, True, cfg.block_n1, act, *launch)
    mq, ms = _quant(mid, w13.fmt, spec, live_rows=al.num_padded)
    sorted_gemm(mq, ms, w2, y, al, n, spec, False, cfg.block_n2, 0, *launch)


LEAVES = {"triton.moe_steps": _gathered, "triton.sorted": _sorted, "triton.sorted_wgmma": partial(_sorted, wgmma=True)}


def run_leaf(kernel: str, cfg: MoeConfig, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: ExpertWeights,
             w2: ExpertWeights, spec: MoeSpec, *, config: MoeConfig | None = None,
             x_q: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
    """One call on the chosen leaf (``config`` is already folded into ``cfg``)."""
    (t, h), k, e = x.shape, topk_ids.shape[1], w13.shape[0]
    n = t * k
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)  # [T, H]
    if n == 0:
        return out
    w = topk_weights.to(torch.float32).contiguous()
    al = align(topk_ids, e, cfg.block_m, cfg.pdl)
    y = torch.empty((n, h), dtype=x.dtype, device=x.device)  # [T*k, H], slot order
    LEAVES[kernel](x.contiguous(), w13, w2, spec, al, k, cfg, y, x_q)
    block_h = min(1024, next_pow2(h))
    _combine_kernel[(t, cdiv(h, block_h))](y, w, out, h, TOP_K=k, ROUND=x.dtype == torch.bfloat16, BLOCK_H=block_h, PDL=cfg.pdl, launch_pdl=cfg.pdl)
    return out


def choose(*args, **kwargs) -> Choice:
    """:func:`.select.select_call` with the leaf bound."""
    c = select_call(*args, **kwargs)
    return replace(c, run=partial(run_leaf, c.kernel, c.config))


def fused_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights, spec: MoeSpec,
              *, config: MoeConfig | None = None, x_q: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
    """x [T, H] -> [T, H] x.dtype.  ``config``: tiles instead of the table's; ``x_q``: x already quantized (step 1
    skipped)."""
    return choose(x, topk_weights, topk_ids, w13, w2, spec, config=config, x_q=x_q).run(x, topk_weights, topk_ids, w13, w2, spec, x_q=x_q)


dispatch.register("fused_moe", "triton", fused_moe, available=available, priority=PRIORITY, select=choose)
dispatch.register_map("fused_moe", kernel_map)
