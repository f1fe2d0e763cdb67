"""Triton backends of :mod:`.fused_act_quant_ref`: RMSNorm or the MLP activation computed and quantized in one pass,
so the activation never goes through memory in bf16.  Rows may be strided, so [gate | up] halves and interleaved views
need no copy.  ``_rmsnorm_quant_kernel`` takes whole rows: pass 1 sums squares, pass 2 reads the row again (from L2)
to normalise and quantize.  Bit for bit: each float32 step is the reference's IEEE operation in its order (no FMA:
``enable_fp_fusion=False``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import formats
from ...formats import e8m0
from .. import dispatch
from . import fused_act_quant_ref as ref
from .group_quant import MODE_FLOAT, MODE_MX, MODE_UE8M0, quant_outputs, store_scales
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
# Launch configs that quantkit bench fused-quant --sweep times, row 0 the default; all give the same bytes.
NORM_TUNING: tuple[dict, ...] = (
    {"block_m": 4, "unroll": 4, "groups": 8, "num_warps": 4},  # default
    {"block_m": 8, "unroll": 4, "groups": 4, "num_warps": 8},  # more rows a program
    {"block_m": 2, "unroll": 8, "groups": 8, "num_warps": 4},  # fewer rows, more loads in flight
    {"block_m": 1, "unroll": 8, "groups": 16, "num_warps": 4},  # one row a program: the most programs at small M
    {"block_m": 16, "unroll": 2, "groups": 2, "num_warps": 8},  # the fewest programs
)
ACT_TUNING: tuple[dict, ...] = (
    {"tile": (8, 4), "num_warps": 4},  # default: 4096 elements a program
    {"tile": (16, 4), "num_warps": 8},  # twice the elements, half the programs
    {"tile": (4, 8), "num_warps": 4},  # longer row segments
)


@triton.jit
def exp_f32(x):
    """fused_act_quant_ref.exp_f32, op for op."""
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
    """[BLOCK_M, LANES] -> [BLOCK_M], lanes added pairwise as the reference."""
    for i in tl.static_range(LOG2_LANES):
        a, b = tl.split(tl.reshape(acc, (BLOCK_M, LANES >> (i + 1), 2)))
        acc = a + b
    return tl.reshape(acc, (BLOCK_M,))


@triton.jit
def quantize_groups(y, MODE: tl.constexpr, RCEIL: tl.constexpr, HW_CAST: tl.constexpr):
    """float32 y [BM, GR, G], zero where masked -> (E4M3 bytes, scales [BM, GR]) as group_quant."""
    amax = abs_max(y, 2)
    if MODE == 0:
        k = e8m0_exponent(amax, 8, 0x600000, RCEIL)
        s = pow2(tl.minimum(k, 127))
        s_out = (k + 127).to(tl.uint8)
    else:
        s = fp8_block_scale(amax, MODE == 2, RCEIL)
        s_out = s
    inv = tl.math.div_rn(1.0, s)  # once per group
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
    rows = row0 + r  # int64
    lane = tl.arange(0, LANES)
    acc = tl.zeros([BLOCK_M, LANES], tl.float32)
    for k0 in range(0, K, LANES * UNROLL):  # pass 1, in the reference's order
        for u in tl.static_range(UNROLL):  # loads in flight together, added in sequence
            cols = k0 + u * LANES + lane
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=rmask[:, None] & (cols < K)[None, :], other=0.0)
            x = x.to(tl.float32)
            acc = acc + x * x
    mean = tl.math.div_rn(pair_sum(acc, BLOCK_M), k_f32)  # float(K), exact for K < 2**24
    rstd = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), tl.sqrt_rn(mean + eps))[:, None, None]
    g = tl.arange(0, GROUPS)
    cols0 = g[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GR, G]
    last = tl.program_id(0) == tl.num_programs(0) - 1
    for gb in range(0, n_groups, GROUPS):  # pass 2
        cols = gb * G + cols0
        mask = rmask[:, None, None] & (cols < K)
        x = tl.load(x_ptr + rows[:, None, None] * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        h = bf16_round(x * rstd, ROUND_H)  # order "hf" rounds h before the weight
        y = bf16_round(w * h, ROUND_Y)
        codes, s_out = quantize_groups(tl.where(mask, y, 0.0), MODE, RCEIL, HW_CAST)
        tl.store(q_ptr + rows[:, None, None] * K + cols, codes, mask=mask)
        store_scales(s_ptr, s_out, rows, gb + g, M, n_groups, ss_m, ss_g, m_pad, last)


@triton.jit
def _silu_mul(g, u, ROUND: tl.constexpr):
    """fused_act_quant_ref.silu_mul, op for op."""
    s = bf16_round(tl.math.div_rn(g, 1.0 + exp_f32(-g)), ROUND)
    return bf16_round(s * u, ROUND)


@triton.jit
def _swiglu(g, u, alpha, limit, ROUND: tl.constexpr):
    """fused_act_quant_ref.swiglu, op for op."""
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


# ---- launchers


def _mode(fmt: str, scale_fmt: str) -> tuple[int, int, torch.dtype]:
    """(MODE, group size, scale dtype) of a format's activation scales: E8M0 bytes (MX), or F32 holding
    powers of two (``ue8m0``) or IEEE quotients."""
    grid = formats.get(fmt).act_scale
    if grid.e8m0:
        return MODE_MX, grid.cols, torch.uint8
    return (MODE_UE8M0 if scale_fmt == "ue8m0" else MODE_FLOAT), grid.cols, torch.float32


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [M, K] with unit stride along K, a view where one exists."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 or t2.shape[-1] == 1 else t2.contiguous()


@dispatch.backend("rmsnorm_act_quant", "triton", available=available, priority=PRIORITY)
def rmsnorm_act_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, order: str = "hf",
    *, scale_mn: bool = False, block_m: int = 4, unroll: int = 4, groups: int = 8, num_warps: int = 4, hw_cast: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """act_quant(RMSNorm(x)) in one kernel, launched as a :data:`NORM_TUNING` row."""
    ref.check_norm(x, weight, eps, fmt, scale_fmt, rule, order, scale_mn)
    mode, group, scale_dtype = _mode(fmt, scale_fmt)
    k = x.shape[-1]
    x2, w = _rows(x), weight.contiguous()
    q, s, s_strides = quant_outputs(tuple(x.shape[:-1]), k, group, scale_dtype, x.device, scale_mn)
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
    (m, n), n_groups = gate.shape, cdiv(gate.shape[1], group)  # [M, N] views, column stride 1 or 2
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
    """act_quant(silu(gate) * up) in one kernel, launched as an :data:`ACT_TUNING` row."""
    ref.check_gate_up(gate, up, fmt, scale_fmt, rule, scale_mn)
    return _launch_act(gate.shape[:-1], _rows(gate), _rows(up), ACT_SILU, fmt, scale_fmt, rule, 0.0, 0.0, tile, num_warps, hw_cast, scale_mn)


@dispatch.backend("swiglu_act_quant", "triton", available=available, priority=PRIORITY)
def swiglu_act_quant(
    gate_up: torch.Tensor, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, alpha: float = 1.702, limit: float = 7.0,
    *, scale_mn: bool = False, tile: tuple[int, int] = (8, 4), num_warps: int = 4, hw_cast: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """act_quant(GPT-OSS SwiGLU(gate_up)) in one kernel."""
    ref.check_interleaved(gate_up, fmt, scale_fmt, rule, scale_mn)
    gu = _rows(gate_up)
    lim = float(torch.tensor(limit, dtype=gate_up.dtype))  # torch's clamp compares in the tensor's dtype
    return _launch_act(gate_up.shape[:-1], gu[:, 0::2], gu[:, 1::2], ACT_SWIGLU, fmt, scale_fmt, rule, ref.f32(alpha), lim, tile, num_warps, hw_cast, scale_mn)
