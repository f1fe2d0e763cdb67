"""Triton fused MoE (vLLM fused_moe style) for FP8-block and MXFP8 experts: the ``triton``
backend of the ``fused_moe`` op (arguments, layouts and numerics: :mod:`.fused_moe_ref`).

One call, no host synchronisation and buffers sized by the shapes only (CUDA-graph safe):

1. x [T, H] is quantized once per token (1x128 F32/UE8M0 or 1x32 E8M0, :mod:`.group_quant`),
   or, with ``fuse_quant`` (a config option; no default uses it: slower on the H200 at T = 1,
   4 and 16), by each GEMM program for its own rows, same bytes;
2. :func:`.moe_routing.align` sorts the T*k (token, slot) pairs by expert into
   BLOCK_M-row blocks, each block one expert;
3. GEMM 1 (:func:`_moe_gemm_kernel`, GATED): each program gathers its block's token rows, walks
   K in 128-column blocks (sub-blocks of 128 for fp8-block, 32 for MX), multiplies by the
   block's expert's gate and up rows (interleaved: rows 2j, 2j+1; concatenated: rows j, I + j)
   with the DeepSeek per-sub-block promotion (fp8 dot times both scales into an f32
   accumulator) or, ``upcast`` (MX only, power-of-two scales), exact bf16 operands, adds the
   bias, rounds to x.dtype and applies the activation in the epilogue -> [T*k, I] in slot order;
   with ``diag`` (a config option, MX experts) the product is taken transposed, weight rows x
   slots, and a 128-column block's four 32-column products come from one fp8 dot on a
   block-diagonal activation tile (:func:`.gemm_skinny.diag_act_tile`), so a block may hold 4
   rows instead of 16 (the MX decode configs, :data:`MX_DECODE`);
4. the intermediate is quantized per row like x (or inside GEMM 2); GEMM 2 (down [E, H, I]
   + bias, rounded to x.dtype) writes [T*k, H];
5. :func:`_combine_kernel`: out[t] = sum_j float32(y[t*k + j]) * w[t, j], a fixed-order
   reduction (no atomics: the result is the same bytes on every run).

Every x.dtype rounding is done in integer arithmetic (:func:`bf16_round`), so the compiled kernel
and the CPU interpreter (whose float32 -> bf16 cast truncates) round alike.  The remaining
differences to the reference are float32 summation order (exact fp8 products) and ``exp``;
the tensor core adds its ~14-bit accumulation within each scale block (DeepSeek-V3 report).
K need not be a multiple of 128 (GPT-OSS's 2880: masked tail).  Configurations come from
:data:`MOE_CONFIGS` by average (token, slot) pairs per expert; past 160 (prefill) both
formats take ``sorted_rows``: the token rows are put in expert order once and both GEMMs read
dense tiles through TMA (:mod:`.fused_moe_sorted`; same numerics).  The few-token rows (``pdl``) launch
the six kernels as programmatic dependents on sm_90+: each waits for its predecessor before touching memory
(:func:`.triton_numerics.pdl_enter`), so only the launches overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .. import dispatch
from .fused_moe_ref import ExpertWeights, MoeSpec, check_moe
from .sorted_tokens import gather_rows, sorted_gemm, sorted_gemm_wgmma, sorted_ok, wgmma_why_not
from .steps import moe_kernel_step
from ..gemm.block_scaled import WORKSPACE, split_reduce_pair, tile_coords
from ..quant.group_quant import act_quant_fp8_block, mxfp8_quantize
from .common import add_bias, moe_activation
from .routing import Alignment, align
from ..triton_numerics import PRIORITY, available, bf16_round, cdiv, hw_e4m3, interpreted, next_pow2, pdl_enter, pdl_ok

BLOCK_K = 128
INT32_LIMIT = 2**31
ACT_CODES = {"silu": 0, "gpt-oss": 1}


@dataclass(frozen=True)
class MoeConfig:
    """Tiles of both GEMMs (one alignment, so one BLOCK_M); ``block_n1`` counts intermediate
    columns (a gated tile reads 2 x block_n1 weight rows)."""

    block_m: int
    block_n1: int
    block_n2: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    upcast: bool = False  # MX experts only: exact bf16 operands, one bf16 dot per 32 columns (``mx_step`` on sorted rows)
    fuse_quant: bool = False  # each GEMM program quantizes its own activation rows (no quant launches)
    split_k: int = 0  # K splits per tile: 0 = enough programs for ``waves`` per SM (few tokens only), 1 = none
    waves: int = 1
    sorted_rows: bool = False  # rows put in expert order once, dense TMA tiles (:mod:`.fused_moe_sorted`; MX: with upcast)
    mx_step: int = 32  # sorted rows, MX experts: K columns per step (32 / 64 / 128), scales folded into bf16 operands
    wgmma: bool = False  # sorted rows, FP8-block, 64- or 128-row blocks: the warp-specialised Gluon kernel (sm_90), num_stages its ring
    diag: bool = False  # gathered rows, MX experts, activations quantized once, no upcast: one block-diagonal fp8 dot per 128 columns
    block_k: int = 128  # gathered rows, FP8-block experts (MX experts keep 128): K columns per step, 128 or 256 (two promoted blocks)
    pdl: bool = False  # gathered rows: the six launches as programmatic dependents (compiled sm_90+; pdl_enter)

    def name(self) -> str:
        flags = ("/up" if self.upcast else "") + ("/fq" if self.fuse_quant else "") + (f"/s{self.split_k}" if self.split_k else "")
        flags += "/sorted" if self.sorted_rows else ""
        flags += f"/k{self.mx_step}" if self.mx_step != 32 else ""
        flags += "/wgmma" if self.wgmma else ""
        flags += "/diag" if self.diag else ""
        flags += f"/bk{self.block_k}" if self.block_k != BLOCK_K else ""
        flags += "/pdl" if self.pdl else ""
        return f"{self.block_m}x{self.block_n1}/{self.block_n2}/w{self.num_warps}/st{self.num_stages}{flags}"


# (largest average (token, slot) pairs per expert, config).  Decode is weight-bandwidth bound:
# 16-row blocks and narrow N tiles so the few hit experts spread over every SM (vLLM H200
# fused_moe fp8 tables use 16 x 32..64 there); prefill is compute bound: 64-row blocks, 128-column GEMM-2 tiles.
# Few tokens (H200, GPT-OSS-120B and DeepSeek-V3 at T = 1 / 4 / 16, per-launch profiles with L2
# flushed): quantizing x and the intermediate in two launches beat ``fuse_quant`` (each program
# re-quantizing its rows) at every T, 4-14% of the MoE time, and 128-column GEMM-2 tiles cut
# GEMM 2 by 4-26% (graph-timed MoE: GPT-OSS-120B T = 1 0.0652 ms against 0.0723 for the
# fused-quantization 16x64/64 config).  Split-K (auto) only until the busy programs give every SM
# one (``waves`` 1): the former 8 per SM was 1.13x / 1.06x slower on GPT-OSS-120B and 1.12x / 1.03x
# on DeepSeek-V3 at T = 1 / 4 (sixth pass, graph-timed; no split at all: within 1-8%).  Ninth pass (padding rows
# masked, clean L2, graph-timed, two repetitions agreeing within 1%): 32-column GEMM-1 tiles (16 intermediate
# columns of each expert per program) against 64: GPT-OSS-120B 1.00-1.04 / 1.05 / 1.01x at T = 1 / 4 / 16 (T = 4
# 132.6 -> 126.5 us), DeepSeek-V3 1.02 / 0.99 / 1.02x; 32-column GEMM-2 tiles, 5 stages, 8 warps: mixed or slower.
# Twelfth pass (graph-timed, read flush; outputs identical in those runs): 256-column K steps on 3 stages (``block_k``: twice the
# weight bytes in flight per stage; Nsight Compute had GEMM 1 at 61% and GEMM 2 at 42% of DRAM peak at T = 1) against
# 128 on 4: GPT-OSS-120B 0.94 / 0.95 / 1.03 / 1.06 / 1.07 / 1.07 / 1.07x at T = 1 / 2 / 4 / 8 / 16 / 64 / 128, DeepSeek-V3
# 0.95 / 1.12 / 1.07 / 1.03 / 1.05 / 1.05 / 1.02x; at T = 512 (the 32-row row) 1.04 / 0.98x, not taken; 4 stages or 8 warps
# with 256-column steps: slower or no better.  Fourteenth pass: the six launches as programmatic dependents (``pdl``), outputs
# identical, two runs: GPT-OSS-120B 1.04 / 1.03 / 1.01 / 1.00x at T = 1 / 4 / 16 / 64 (45.1 -> 43.2 us at T = 1), DeepSeek-V3
# 1.00 / 1.01 / 1.00 / 0.99-1.00x; MX experts 1.01-1.05x at T = 1 / 4 / 16: on in the rows to 0.5 pairs per expert and the MX rows.
# Fifteenth pass (two repetitions within 0.5%, outputs identical): 64-column GEMM-2 tiles against 128, GPT-OSS-120B 1.01 / 1.02 /
# 1.01 / 1.02 / 1.00x at T = 1 / 2 / 4 / 8 / 16 (at T = 1 GEMM 2 then needs no K split), DeepSeek-V3 1.00 / 1.02-1.03 / 1.00 /
# 1.00 / 1.00x.  64-column GEMM-1 tiles: 0.88-1.16x, the sign flipping from one token count to the next in all four models
# measured (GPT-OSS-120B, DeepSeek-V3, Qwen3-235B, Qwen3-30B-A3B at T = 1-8): it follows how the routed blocks fill the last
# wave, which no shape-keyed row can know; not taken.  Sixteenth pass (scripts/sweep_moe_decode.py, graph-timed, L2 flushed;
# GPT-OSS-20B and Qwen3-30B-A3B experts, the served models, at T = 1-256): the 32-row row lost at every T it held --
# 8-16 pairs per expert (GPT-OSS-20B T = 128, Qwen3-30B-A3B T = 256) run the 16-row bk256 tiles 1.07x / 1.01x faster,
# and at 32 pairs (GPT-OSS-20B T = 256) 64-row blocks (each expert's weight read once rather than up to twice) 1.13x
# (0.3166 against 0.3566 ms); every other row within 4% of the best of 15 configs.
MOE_CONFIGS: tuple[tuple[float, MoeConfig], ...] = (
    (1 / 32, MoeConfig(16, 32, 64, num_warps=4, num_stages=4, pdl=True)),  # one token: 4 of 128 / 8 of 256 experts
    (0.5, MoeConfig(16, 32, 64, num_warps=4, num_stages=3, block_k=256, pdl=True)),
    (16, MoeConfig(16, 64, 64, num_warps=4, num_stages=3, block_k=256)),  # GPT-OSS-120B T=128: 0.871 ms vs 1.019 (16x32/32), 0.822 with bk256
    (48, MoeConfig(64, 64, 64, num_warps=4, num_stages=4, pdl=True)),
    (160, MoeConfig(64, 64, 128, num_warps=4, num_stages=3)),
    # 8192-token prefill, fp8-block: expert-sorted rows through TMA on the warp-specialised Gluon
    # kernel, 64-row expert blocks (both warpgroups on every row, 256 weight rows per tile), 4
    # stages (seventh pass: 2.97 / 8.64 ms against PREFILL_TILED's 3.21 / 10.20 on GPT-OSS-120B /
    # DeepSeek-V3, 128-row blocks 3.05-3.13 / 9.18-9.47; the same output bytes; PREFILL_TILED runs
    # where it cannot)
    (float("inf"), MoeConfig(64, 64, 128, num_stages=4, sorted_rows=True, wgmma=True)),
)
# MXFP8 experts at decode, to 16 (token, slot) pairs per expert on average: block-diagonal dots (``diag``) on 4- and 8-row
# blocks, with weight tiles Triton runs on mma.sync (fewer than 64 rows, or fewer than 4 warps), whose fp8 dot sums each
# 32-product in full float32 like the per-32 dots before; on wgmma (64+ rows, 4 warps) the sums keep about 14 bits, and the
# re-quantized intermediate turned that into E4M3 flips: 3e-3 relative L2 from the per-32 dots, against 2e-5 - 4e-4 here.
# Eleventh pass, graph-timed (docs/benchmarks.md): GPT-OSS-120B T = 1 / 4 / 16 / 64 in 61.4 / 146.6 / 419.8 / 886.7 us
# against 91.4 / 230.8 / 637.9 / 1335.2 for the former 16-row per-32 configs, DeepSeek-V3 120.7 / 343.9 / 872.2 / 1898.4
# against 202.7 / 595.9 / 1475.8 / 2954.3; 8x64/64 on 2 warps at T = 128 (4 pairs per expert) 1067.6 / 2639.3 against
# 1531.3 / 3896.0, at T = 512 (16 pairs) 1981.2 / 6131.7 against 2189.6 / 7143.3 (32-row blocks); at 32 pairs 0.92 / 0.98x.
# K split for 4 programs per SM (``waves`` 4) at the fewest tokens: GPT-OSS-120B T = 1 51.5 us against 60.3 with 1 (DeepSeek-V3
# 109.2 against 112.1), T = 4 / 16 unchanged; 2 / 8 / 16 per SM 0.89-1.06x.
MX_DECODE: tuple[tuple[float, MoeConfig], ...] = (
    (2, MoeConfig(4, 32, 64, num_warps=2, num_stages=3, waves=4, diag=True, pdl=True)),
    (16, MoeConfig(8, 64, 64, num_warps=2, num_stages=3, diag=True, pdl=True)),
)
# MXFP8 experts past MX_DECODE, to 48 pairs per expert: the 32-row tiles FP8-block experts ran there before the
# sixteenth pass (which timed FP8-block experts only)
MX_MID = (48, MoeConfig(32, 64, 64, num_warps=4, num_stages=4))
# Triton sorted-row tiles: 1.30x (GPT-OSS-120B) / 1.11x (DeepSeek-V3) the same tiles on gathered
# rows, which were 1.13x / 1.11x the 128x64/128 w8 ones
PREFILL_TILED = MoeConfig(64, 64, 128, num_warps=4, num_stages=4, sorted_rows=True)


# MXFP8 experts past the table's last limit (H200, 8192 tokens): bf16 operands (upcast) on
# expert-sorted rows, 1.50x (GPT-OSS-120B, 10.736 -> 7.150 ms) / 1.33x (DeepSeek-V3, 35.03 ->
# 26.25 ms) the former 128x128/128 w8 tiles on gathered rows; the same output bytes.  Concatenated
# gate/up (``interleaved`` False) takes 64-column steps, whose activation tile is upcast once for
# both dots: DeepSeek-V3 26.16 -> 24.35 ms (1.07x, same run); interleaved GPT-OSS-120B stays at 32
# (7.07 ms; 64 columns 7.35, 128 columns 8.26).
MX_PREFILL_CONFIG = MoeConfig(64, 64, 128, num_warps=4, num_stages=4, upcast=True, sorted_rows=True)
MX_PREFILL_STEP_CONCAT = 64


def pick_moe_config(n_pairs: int, num_experts: int, fmt: str, interleaved: bool = True) -> MoeConfig:
    """The table's config for ``n_pairs`` (token, slot) pairs over ``num_experts``; ``interleaved``:
    the gate/up layout (MX prefill steps differ)."""
    avg = n_pairs / max(num_experts, 1)
    cfg = next(c for limit, c in MOE_CONFIGS if avg <= limit)
    if fmt == "mxfp8" and avg <= MX_DECODE[-1][0]:
        return next(c for limit, c in MX_DECODE if avg <= limit)
    if fmt == "mxfp8" and avg <= MX_MID[0]:
        return MX_MID[1]
    if fmt == "mxfp8" and avg > MOE_CONFIGS[-2][0]:
        return MX_PREFILL_CONFIG if interleaved else replace(MX_PREFILL_CONFIG, mx_step=MX_PREFILL_STEP_CONCAT)
    if fmt == "mxfp8" and cfg.block_m >= 64:  # per-32 promotion costs more than exact bf16 operands there
        return replace(cfg, upcast=True)
    return cfg


@triton.jit(do_not_specialize=["n_slots", "up_off", "EM", "kb_per_split"])
def _moe_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr, part_ptr, count_ptr,
    n_slots, EM, N, K, up_off, AS_COLS, WS_COLS, alpha, limit, kb_per_split,
    s_am, s_asm, s_we, s_wn, s_wse, s_wsn, s_be, s_om,
    TOP_K: tl.constexpr, GATED: tl.constexpr, ROW_STEP: tl.constexpr, ACT: tl.constexpr, ROUND: tl.constexpr,
    A_KPS: tl.constexpr, A_E8M0: tl.constexpr, W_RPS: tl.constexpr, W_KPS: tl.constexpr, W_E8M0: tl.constexpr,
    W_UNIFORM: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr,
    QMODE: tl.constexpr, RCEIL: tl.constexpr, HW_CAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_SPLIT: tl.constexpr, DIAG: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """out[slot, :N] for one BLOCK_M block of slots (one expert) and BLOCK_N output columns;
    program_id(1) picks the split of K (``kb_per_split`` BLOCK_K-column blocks each).  DIAG (MX experts, activations
    quantized): the transposed block-diagonal product of :func:`.fused_moe_steps.moe_step_diag`."""
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
                                        QMODE, RCEIL, HW_CAST, BLOCK_M, BLOCK_K, SUB_K, False, DIAG)  # fmt: skip
    if (kb_hi > n_full) & (kb_lo <= n_full):  # this split holds the partial last block
        acc_g, acc_u = moe_kernel_step(acc_g, acc_u, n_full, a_ptr, as_ptr, w_e, ws_e, a_row, valid, row_g, row_u, row0, up_off, K, AS_COLS, WS_COLS,
                                        s_am, s_asm, s_wn, s_wsn, GATED, A_KPS, A_E8M0, W_RPS, W_KPS, W_E8M0, W_UNIFORM, UPCAST, UP_DTYPE,
                                        QMODE, RCEIL, HW_CAST, BLOCK_M, BLOCK_K, SUB_K, True, DIAG)  # fmt: skip
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
    """Per-row activation quantization: (E4M3 [R, K], F32 [R, ceil(K/128)] or U8 [R, K/32]); rows at or past
    ``live_rows`` (int32 [1], on the device) are not read and quantize as zeros."""
    if fmt == "fp8-block":
        return act_quant_fp8_block(x, spec.scale_fmt, spec.rule, pdl=pdl, live_rows=live_rows)
    return mxfp8_quantize(x, spec.rule, pdl=pdl, live_rows=live_rows)


def _gemm(a: torch.Tensor, sa: torch.Tensor | None, w: ExpertWeights, out: torch.Tensor, al: Alignment, n_slots: int,
          top_k: int, spec: MoeSpec, gated: bool, block_n: int, cfg: MoeConfig, pdl: bool = False) -> None:  # fmt: skip
    """Launch one grouped GEMM (gated: GEMM 1 with the activation; else GEMM 2).  ``sa`` None:
    ``a`` is x.dtype and each program quantizes it (``cfg.fuse_quant``)."""
    _, nw, k = w.shape
    n_out = nw // 2 if gated else nw
    fp8b = w.fmt == "fp8-block"
    ws = w.scale.view(torch.uint8) if not fp8b else w.scale
    qmode = -1 if sa is not None else (0 if not fp8b else 2 if spec.scale_fmt == "ue8m0" else 1)
    sa = a if sa is None else sa  # stands in for the scales, never read when qmode >= 0
    assert a.shape[1] == k and sa.is_contiguous() and ws.is_contiguous() and w.q.stride(2) == 1 and a.stride(1) == 1, "fused_moe: layouts"
    assert out.shape == (n_slots, n_out) and out.is_contiguous(), f"fused_moe: output {tuple(out.shape)}, want ({n_slots}, {n_out})"
    assert max(a.numel(), w.q[0].numel(), out.numel()) < INT32_LIMIT, "fused_moe: 32-bit offsets overflow"
    assert not (cfg.upcast and fp8b), "upcast is exact only with power-of-two (MX) scales"
    diag = cfg.diag and not fp8b and not cfg.upcast and qmode < 0
    assert diag or al.block_m >= 16, f"{cfg.name()}: the tensor-core dot needs 16-row blocks (fewer only on MX experts' block-diagonal dots)"
    interleaved = gated and spec.interleaved
    row_step, up_off = (2, 1) if interleaved else (1, n_out if gated else 0)
    # one weight scale row per tile (gate and up alike): a scalar scale load and promotion
    uniform = fp8b and 128 % (block_n * row_step) == 0 and up_off % (1 if interleaved else 128) == 0
    block_k = cfg.block_k if fp8b else BLOCK_K
    assert block_k in (BLOCK_K, 2 * BLOCK_K), f"{cfg.name()}: block_k 128, or 256 (FP8-block experts)"
    bias = w.bias if w.bias is not None else out
    cap = al.sorted_ids.shape[0]
    tiles = cdiv(cap, al.block_m) * cdiv(n_out, block_n)
    split, per = moe_split(cfg, tiles, n_slots, n_out, block_n, k, out.device, block_k)
    part, count = (out, out)
    if split > 1:
        part = WORKSPACE.partials(split * tiles * al.block_m * block_n * (2 if gated else 1), out.device)
        count = WORKSPACE.counters(tiles, out.device)
    _moe_gemm_kernel[(tiles, split)](
        a, sa, w.q, ws, bias, out, al.sorted_ids, al.expert_ids, al.num_padded, part, count,
        n_slots, cap, n_out, k, up_off, sa.shape[1], ws.shape[2], spec.alpha, spec.limit, per,
        a.stride(0), sa.stride(0), w.q.stride(0), w.q.stride(1), ws.stride(0), ws.stride(1), bias.stride(0), out.stride(0),
        TOP_K=top_k, GATED=gated, ROW_STEP=row_step, ACT=ACT_CODES[spec.activation] if gated else 0,
        ROUND=out.dtype == torch.bfloat16, A_KPS=128 if fp8b else 32, A_E8M0=sa.dtype == torch.uint8,
        W_RPS=128 if fp8b else 1, W_KPS=128 if fp8b else 32, W_E8M0=not fp8b, W_UNIFORM=uniform, HAS_BIAS=w.bias is not None,
        UPCAST=cfg.upcast, UP_DTYPE=tl.float32 if interpreted() else tl.bfloat16,
        QMODE=qmode, RCEIL=spec.rule == "rceil", HW_CAST=hw_e4m3(a.device),
        BLOCK_M=al.block_m, BLOCK_N=block_n, BLOCK_K=block_k, SUB_K=128 if fp8b else 32,
        GROUP_M=cfg.group_m, HAS_SPLIT=split > 1, DIAG=diag, PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip


def moe_split(cfg: MoeConfig, tiles: int, n_pairs: int, n_out: int, block_n: int, k: int, device: torch.device,
              block_k: int = BLOCK_K) -> tuple[int, int]:  # fmt: skip
    """(K splits, ``block_k`` blocks per split) of one grouped GEMM.  Auto (``split_k`` 0): with few
    (token, slot) pairs the busy programs -- at most min(row blocks, pairs) x column tiles -- cannot
    fill ``waves`` per SM, so K is split until they can (at least 2 K-blocks per split); the
    partial sums are reduced in split order (deterministic)."""
    n_kb = cdiv(k, block_k)
    want = cfg.split_k
    if not want:
        busy = min(tiles // cdiv(n_out, block_n), n_pairs) * cdiv(n_out, block_n)
        want = max(1, min(cdiv(cfg.waves * dispatch.sm_count(device), max(busy, 1)), n_kb // 2))
    per = cdiv(n_kb, max(1, min(want, n_kb)))
    return cdiv(n_kb, per), per


def fused_moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    spec: MoeSpec,
    *,
    config: MoeConfig | None = None,
    x_q: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """x [T, H] -> [T, H] x.dtype; see the module docstring (no host sync).  ``x_q``: x already quantized
    by the op's rule (:func:`.fused_moe_ref.fused_moe_ref`); step 1's quantization is then skipped."""
    t, h, _, e = check_moe(x, topk_weights, topk_ids, w13, w2)
    k = topk_ids.shape[1]
    n = t * k
    cfg = config or pick_moe_config(n, e, w13.fmt, spec.interleaved)
    if x_q is not None and cfg.fuse_quant:
        raise ValueError(f"fused_moe {cfg.name()}: a fused-quantization config takes unquantized activations, not x_q")
    if cfg.wgmma:
        why = wgmma_why_not(w13, w2, spec, cfg.block_m, x.device)
        if why is not None and config is not None:
            raise ValueError(f"fused_moe {cfg.name()}: {why}")
        cfg = cfg if why is None else PREFILL_TILED
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)  # [T, H]
    if n == 0:
        return out
    sorted_rows = cfg.sorted_rows and sorted_ok(w13, w2, spec, cfg.block_n1, cfg.block_n2, cfg.upcast)
    # the gathered-row chain (align, quantize, GEMM 1, quantize, GEMM 2, combine) as programmatic dependents: each
    # launch overlaps its predecessor's tail (pdl_enter)
    pdl = pdl_ok(x.device, cfg.pdl and not sorted_rows)
    w = topk_weights.to(torch.float32).contiguous()
    al = align(topk_ids, e, cfg.block_m, pdl)
    y = torch.empty((n, h), dtype=x.dtype, device=x.device)  # [T*k, H], slot order
    if sorted_rows:
        _experts_sorted(x.contiguous(), w13, w2, spec, al, k, cfg, y, x_q)
    else:
        _experts_gathered(x.contiguous(), w13, w2, spec, al, k, cfg, y, pdl, x_q)
    block_h = min(1024, next_pow2(h))
    _combine_kernel[(t, cdiv(h, block_h))](y, w, out, h, TOP_K=k, ROUND=x.dtype == torch.bfloat16, BLOCK_H=block_h, PDL=pdl, launch_pdl=pdl)
    return out


def _experts_gathered(x, w13, w2, spec, al, k, cfg, y, pdl: bool = False, x_q=None) -> None:
    """Both GEMMs on gathered token rows (the module docstring's steps 1-4) -> y [T*k, H]."""
    n, inter = y.shape[0], w2.q.shape[2]
    quant = (lambda t_: (t_, None)) if cfg.fuse_quant else (lambda t_: _quant(t_, w13.fmt, spec, pdl))  # noqa: E731
    a, sa = quant(x) if x_q is None else x_q  # once per token: E4M3 [T, H]
    mid = torch.empty((n, inter), dtype=x.dtype, device=x.device)  # [T*k, I], slot order
    _gemm(a, sa, w13, mid, al, n, k, spec, True, cfg.block_n1, cfg, pdl)
    mq, ms = quant(mid)
    _gemm(mq, ms, w2, y, al, n, 1, spec, False, cfg.block_n2, cfg, pdl)


def _experts_sorted(x, w13, w2, spec, al, k, cfg, y, x_q=None) -> None:
    """Both GEMMs on expert-sorted rows (:mod:`.fused_moe_sorted`) -> y [T*k, H]."""
    assert not cfg.fuse_quant, f"{cfg.name()}: sorted rows take activations quantized once"
    n, inter = y.shape[0], w2.q.shape[2]
    a, sa = gather_rows(*(_quant(x, w13.fmt, spec) if x_q is None else x_q), al, n, k)  # [cap, H] in sorted order
    # [cap, I], sorted order; GEMM 1 writes the rows below num_padded only (its programs past it exit), so its
    # quantizer reads no further (the rest is whatever the allocation held: the CPU interpreter warned of its NaN
    # arithmetic) and GEMM 2's programs there exit too
    mid = torch.empty((al.sorted_ids.shape[0], inter), dtype=x.dtype, device=x.device)
    if cfg.wgmma:  # fused_moe checked wgmma_why_not
        sorted_gemm_wgmma(a, sa, w13, mid, al, n, spec, True, ACT_CODES[spec.activation], cfg.num_stages, cfg.group_m)
        mq, ms = _quant(mid, w13.fmt, spec, live_rows=al.num_padded)
        sorted_gemm_wgmma(mq, ms, w2, y, al, n, spec, False, 0, cfg.num_stages, cfg.group_m)
        return
    launch = (cfg.num_warps, cfg.num_stages, cfg.group_m, cfg.mx_step)
    sorted_gemm(a, sa, w13, mid, al, n, spec, True, cfg.block_n1, ACT_CODES[spec.activation], *launch)
    mq, ms = _quant(mid, w13.fmt, spec, live_rows=al.num_padded)
    sorted_gemm(mq, ms, w2, y, al, n, spec, False, cfg.block_n2, 0, *launch)


dispatch.register("fused_moe", "triton", fused_moe, available=available, priority=PRIORITY)
