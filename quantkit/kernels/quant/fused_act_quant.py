"""Triton backends of the fused activation-quantization ops (:mod:`.fused_act_quant_ref` defines
them): RMSNorm or the MLP activation computed and quantized in one pass, so the activation is
never written out in bf16 and read back.

Layouts: x [..., K] / gate, up [..., I] / gate_up [..., 2I] are read as [M, K] rows (each row
contiguous along K; rows may be strided, so [gate | up] halves and interleaved views need no
copy); q E4M3 [..., K] and scales [..., ceil(K/G)] contiguous, G = 128 (fp8-block, F32 scales,
partial last group zero-padded) or 32 (mxfp8, U8 E8M0).

* ``_rmsnorm_quant_kernel``: one program per BLOCK_M rows covering the whole row.  Pass 1 loops
  over K in 128-wide chunks (UNROLL chunks loaded per step, added in order) accumulating x**2
  per lane, then adds the 128 lanes pairwise (the reference's specified order); pass 2 re-reads
  the row (from L2) group by group, normalises, rounds to the activation dtype, quantizes and
  stores bytes and scales.
* ``_act_quant_kernel``: one program per [BLOCK_M rows, GROUPS groups] tile (no row-wide
  reduction): loads gate and up, applies SiLU-and-mul or GPT-OSS's SwiGLU op by op, quantizes.

Numerics, bit for bit: every float32 step is an IEEE operation in the reference's order --
divisions ``div_rn``, square roots ``sqrt_rn``, no FMA contraction (launched with
``enable_fp_fusion=False``), exp as the reference's Cephes polynomial, rounding to bfloat16 from
the float32 bits (RNE; the interpreter's own cast mishandles subnormals); quantization as
:mod:`.group_quant` (amax, scale, IEEE quotient, E4M3 nearest, from :mod:`.triton_numerics`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import e8m0, fp8_block, mxfp8
from .. import dispatch
from . import fused_act_quant_ref as ref
from .group_quant import MODE_FLOAT, MODE_MX, MODE_UE8M0, quant_outputs, store_scales  # shared with the plain quantizer
from ..triton_numerics import (
    PRIORITY,
    abs_max,
    available,
    bf16_round,
    cdiv,
    divide,
    e4m3_code,
    e8m0_exponent,
    fp8_block_scale,
    hw_e4m3,
    next_pow2,
    pow2,
)

ACT_SILU, ACT_SWIGLU = 0, 1
LANES: tl.constexpr = tl.constexpr(ref.SUMSQ_LANES)
LOG2_LANES: tl.constexpr = tl.constexpr(ref.SUMSQ_LANES.bit_length() - 1)
EXP_LO: tl.constexpr = tl.constexpr(ref.EXP_LO)
EXP_HI: tl.constexpr = tl.constexpr(ref.EXP_HI)
LOG2E: tl.constexpr = tl.constexpr(ref.LOG2E)
EXP_C1: tl.constexpr = tl.constexpr(ref.EXP_C1)
EXP_C2: tl.constexpr = tl.constexpr(ref.EXP_C2)
P0, P1, P2, P3, P4, P5 = (tl.constexpr(c) for c in ref.EXP_P)
# launch configurations scripts/bench_fused_quant.py --sweep times (the first is the default); all give the same bytes
NORM_TUNING: tuple[dict, ...] = (
    {"block_m": 4, "unroll": 4, "groups": 8, "num_warps": 4},
    {"block_m": 8, "unroll": 4, "groups": 4, "num_warps": 8},
    {"block_m": 2, "unroll": 8, "groups": 8, "num_warps": 4},
    {"block_m": 1, "unroll": 8, "groups": 16, "num_warps": 4},
    {"block_m": 16, "unroll": 2, "groups": 2, "num_warps": 8},
)
ACT_TUNING: tuple[dict, ...] = ({"tile": (8, 4), "num_warps": 4}, {"tile": (16, 4), "num_warps": 8}, {"tile": (4, 8), "num_warps": 4})


@triton.jit
def exp_f32(x):
    """fused_act_quant_ref.exp_f32 (Cephes expf), op for op."""
    xc = tl.clamp(x, EXP_LO, EXP_HI, propagate_nan=tl.PropagateNan.ALL)
    nf = tl.floor(xc * LOG2E + 0.5)
    r = (xc - nf * EXP_C1) - nf * EXP_C2
    p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5
    y = (p * (r * r) + r) + 1.0
    n = tl.where(nf != nf, 0.0, nf).to(tl.int32)
    n1 = n >> 1
    return (y * pow2(n1)) * pow2(n - n1)


@triton.jit
def pair_sum(acc, BLOCK_M: tl.constexpr):
    """[BLOCK_M, LANES] -> [BLOCK_M]: lanes (2j, 2j+1) added, LOG2_LANES rounds (the reference's order)."""
    for i in tl.static_range(LOG2_LANES):
        a, b = tl.split(tl.reshape(acc, (BLOCK_M, LANES >> (i + 1), 2)))
        acc = a + b
    return tl.reshape(acc, (BLOCK_M,))


@triton.jit
def quantize_groups(y, MODE: tl.constexpr, RCEIL: tl.constexpr, HW_CAST: tl.constexpr):
    """float32 y [BM, GR, G] (zero where masked) -> (E4M3 bytes [BM, GR, G], scales [BM, GR]), as group_quant."""
    amax = abs_max(y, 2)
    if MODE == 0:
        k = e8m0_exponent(amax, 8, 0x600000, RCEIL)
        s = pow2(tl.minimum(k, 127))
        s_out = (k + 127).to(tl.uint8)  # k = 128 (NaN/Inf amax) -> 0xFF
    else:
        s = fp8_block_scale(amax, MODE == 2, RCEIL)
        s_out = s
    inv = tl.math.div_rn(1.0, s)  # once per group, then broadcast
    v = divide(y, s[:, :, None], inv[:, :, None], MODE != 1)
    return e4m3_code(v, v, False, HW_CAST), s_out


@triton.jit(do_not_specialize=["k_f32", "eps", "m_pad"])
def _rmsnorm_quant_kernel(
    x_ptr, w_ptr, q_ptr, s_ptr, M, K, n_groups, stride_x, k_f32, eps, ss_m, ss_g, m_pad,
    G: tl.constexpr, BLOCK_M: tl.constexpr, UNROLL: tl.constexpr, GROUPS: tl.constexpr, MODE: tl.constexpr,
    RCEIL: tl.constexpr, HW_CAST: tl.constexpr, ROUND_H: tl.constexpr, ROUND_Y: tl.constexpr,
):  # fmt: skip
    row0 = tl.program_id(0).to(tl.int64) * BLOCK_M
    r = tl.arange(0, BLOCK_M)
    rmask = r < M - row0
    rows = row0 + r  # int64 [BM]
    lane = tl.arange(0, LANES)
    acc = tl.zeros([BLOCK_M, LANES], tl.float32)
    for k0 in range(0, K, LANES * UNROLL):  # pass 1: sum of squares, lane j adds x[j], x[j+128], ... in order
        for u in tl.static_range(UNROLL):  # UNROLL independent loads in flight, added in sequence
            cols = k0 + u * LANES + lane
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=rmask[:, None] & (cols < K)[None, :], other=0.0)
            x = x.to(tl.float32)
            acc = acc + x * x
    mean = tl.math.div_rn(pair_sum(acc, BLOCK_M), k_f32)  # float(K), exact for K < 2**24
    rstd = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), tl.sqrt_rn(mean + eps))[:, None, None]
    g = tl.arange(0, GROUPS)
    cols0 = g[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GR, G]
    last = tl.program_id(0) == tl.num_programs(0) - 1
    for gb in range(0, n_groups, GROUPS):  # pass 2: normalise, round, quantize group by group
        cols = gb * G + cols0
        mask = rmask[:, None, None] & (cols < K)
        x = tl.load(x_ptr + rows[:, None, None] * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        h = bf16_round(x * rstd, ROUND_H)  # order "hf": h.to(bfloat16) before the weight
        y = bf16_round(w * h, ROUND_Y)
        codes, s_out = quantize_groups(tl.where(mask, y, 0.0), MODE, RCEIL, HW_CAST)
        tl.store(q_ptr + rows[:, None, None] * K + cols, codes, mask=mask)
        store_scales(s_ptr, s_out, rows, gb + g, M, n_groups, ss_m, ss_g, m_pad, last)


@triton.jit
def _silu_mul(g, u, ROUND: tl.constexpr):
    """fused_act_quant_ref.silu_mul: silu in float32, rounded, times up, rounded."""
    s = bf16_round(tl.math.div_rn(g, 1.0 + exp_f32(-g)), ROUND)
    return bf16_round(s * u, ROUND)


@triton.jit
def _swiglu(g, u, alpha, limit, ROUND: tl.constexpr):
    """fused_act_quant_ref.swiglu, op for op (each op rounded to the activation dtype)."""
    g = tl.minimum(g, limit, propagate_nan=tl.PropagateNan.ALL)
    u = tl.maximum(tl.minimum(u, limit, propagate_nan=tl.PropagateNan.ALL), -limit, propagate_nan=tl.PropagateNan.ALL)
    t = bf16_round(g * alpha, ROUND)
    sig = bf16_round(tl.math.div_rn(tl.full(t.shape, 1.0, tl.float32), 1.0 + exp_f32(-t)), ROUND)
    u1 = bf16_round(u + 1.0, ROUND)
    gs = bf16_round(g * sig, ROUND)
    return bf16_round(u1 * gs, ROUND)


@triton.jit(do_not_specialize=["alpha", "limit", "m_pad"])
def _act_quant_kernel(
    g_ptr, u_ptr, q_ptr, s_ptr, M, N, n_groups, sg_row, sg_col, su_row, su_col, alpha, limit, ss_m, ss_g, m_pad,
    ACT: tl.constexpr, ROUND: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, GROUPS: tl.constexpr,
    MODE: tl.constexpr, RCEIL: tl.constexpr, HW_CAST: tl.constexpr,
):  # fmt: skip
    row0 = tl.program_id(0).to(tl.int64) * BLOCK_M
    grp0 = tl.program_id(1) * GROUPS
    r = tl.arange(0, BLOCK_M)
    g = tl.arange(0, GROUPS)
    rows = (row0 + r)[:, None, None]  # int64
    cols = (grp0 + g)[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GR, G]
    mask = (r[:, None, None] < M - row0) & (cols < N)
    gv = tl.load(g_ptr + rows * sg_row + cols * sg_col, mask=mask, other=0.0).to(tl.float32)
    uv = tl.load(u_ptr + rows * su_row + cols * su_col, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        h = _silu_mul(gv, uv, ROUND)
    else:
        h = _swiglu(gv, uv, alpha, limit, ROUND)
    codes, s_out = quantize_groups(tl.where(mask, h, 0.0), MODE, RCEIL, HW_CAST)
    tl.store(q_ptr + rows * N + cols, codes, mask=mask)
    last = tl.program_id(0) == tl.num_programs(0) - 1
    store_scales(s_ptr, s_out, row0 + r, grp0 + g, M, n_groups, ss_m, ss_g, m_pad, last)


# ---- launchers ----------------------------------------------------------------------------------


def _mode(fmt: str, scale_fmt: str) -> tuple[int, int, torch.dtype]:
    """(MODE, group size, scale dtype) of an activation format."""
    if fmt == "mxfp8":
        return MODE_MX, mxfp8.BLOCK, torch.uint8
    return (MODE_UE8M0 if scale_fmt == "ue8m0" else MODE_FLOAT), fp8_block.BLOCK, torch.float32


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., K] -> a 2-D [M, K] view with unit stride along K (a copy only when no such view exists)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 or t2.shape[-1] == 1 else t2.contiguous()


@dispatch.backend("rmsnorm_act_quant", "triton", available=available, priority=PRIORITY)
def rmsnorm_act_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, order: str = "hf",
    *, scale_mn: bool = False, block_m: int = 4, unroll: int = 4, groups: int = 8, num_warps: int = 4, hw_cast: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """act_quant(RMSNorm(x)) in one kernel; ``block_m`` rows per program, ``unroll`` 128-chunks per
    pass-1 step, ``groups`` groups per pass-2 step (none changes the bytes); ``scale_mn`` as in the reference."""
    ref.check_norm(x, weight, eps, fmt, scale_fmt, rule, order, scale_mn)
    mode, group, scale_dtype = _mode(fmt, scale_fmt)
    k = x.shape[-1]
    x2, w = _rows(x), weight.contiguous()
    q, s, s_strides = quant_outputs(tuple(x.shape[:-1]), k, group, scale_dtype, x.device, scale_mn)  # MN-major: fp8-block only (ref.check_fmt)
    m, n_groups = x2.shape[0], cdiv(k, group)
    out_dtype = torch.promote_types(weight.dtype, x.dtype) if order == "hf" else x.dtype
    block_m = min(block_m, next_pow2(max(m, 1)))
    groups = min(groups, next_pow2(n_groups))
    if m:
        _rmsnorm_quant_kernel[(cdiv(m, block_m),)](
            x2, w, q.view(torch.uint8), s, m, k, n_groups, x2.stride(0), float(k), ref.f32(eps), *s_strides,
            G=group, BLOCK_M=block_m, UNROLL=unroll, GROUPS=groups, MODE=mode, RCEIL=rule == "rceil", HW_CAST=hw_e4m3(x.device, hw_cast),
            ROUND_H=order == "hf" and x.dtype == torch.bfloat16, ROUND_Y=out_dtype == torch.bfloat16,
            num_warps=num_warps, enable_fp_fusion=False,
        )  # fmt: skip
    return q, s


def _launch_act(
    lead: tuple[int, ...], gate: torch.Tensor, up: torch.Tensor, act: int, fmt: str, scale_fmt: str, rule: str, alpha: float, limit: float,
    tile: tuple[int, int], num_warps: int, hw_cast: bool | None, scale_mn: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    mode, group, scale_dtype = _mode(fmt, scale_fmt)
    (m, n), n_groups = gate.shape, cdiv(gate.shape[1], group)  # gate, up: [M, N] views, unit column stride or 2
    q, s, s_strides = quant_outputs(lead, n, group, scale_dtype, gate.device, scale_mn)
    block_m = min(tile[0], next_pow2(max(m, 1)))
    groups = min(tile[1], next_pow2(n_groups))
    if m:
        grid = (cdiv(m, block_m), cdiv(n_groups, groups))
        _act_quant_kernel[grid](
            gate, up, q.view(torch.uint8), s, m, n, n_groups, *gate.stride(), *up.stride(), alpha, limit, *s_strides,
            ACT=act, ROUND=gate.dtype == torch.bfloat16, G=group, BLOCK_M=block_m, GROUPS=groups, MODE=mode,
            RCEIL=rule == "rceil", HW_CAST=hw_e4m3(gate.device, hw_cast), num_warps=num_warps, enable_fp_fusion=False,
        )  # fmt: skip
    return q, s


@dispatch.backend("silu_mul_act_quant", "triton", available=available, priority=PRIORITY)
def silu_mul_act_quant(
    gate: torch.Tensor, up: torch.Tensor, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE,
    *, scale_mn: bool = False, tile: tuple[int, int] = (8, 4), num_warps: int = 4, hw_cast: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """act_quant(silu(gate) * up) in one kernel; ``tile`` = (rows, groups) per program."""
    ref.check_gate_up(gate, up, fmt, scale_fmt, rule, scale_mn)
    return _launch_act(gate.shape[:-1], _rows(gate), _rows(up), ACT_SILU, fmt, scale_fmt, rule, 0.0, 0.0, tile, num_warps, hw_cast, scale_mn)


@dispatch.backend("swiglu_act_quant", "triton", available=available, priority=PRIORITY)
def swiglu_act_quant(
    gate_up: torch.Tensor, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, alpha: float = 1.702, limit: float = 7.0,
    *, scale_mn: bool = False, tile: tuple[int, int] = (8, 4), num_warps: int = 4, hw_cast: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """act_quant(GPT-OSS SwiGLU(gate_up)) in one kernel, interleaved gate_up [..., 2I]."""
    ref.check_interleaved(gate_up, fmt, scale_fmt, rule, scale_mn)
    gu = _rows(gate_up)
    lim = float(torch.tensor(limit, dtype=gate_up.dtype))  # torch's clamp compares with the limit in the tensor's dtype
    return _launch_act(gate_up.shape[:-1], gu[:, 0::2], gu[:, 1::2], ACT_SWIGLU, fmt, scale_fmt, rule, ref.f32(alpha), lim, tile, num_warps, hw_cast, scale_mn)
