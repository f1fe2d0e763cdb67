"""Triton 1xG group quantization along K: MXFP8 (G = 32, E8M0 scales) and DeepSeek's per-token ``act_quant``
(G = 128, F32 or UE8M0 scales).

x [..., K] is read as [M, K]; q E4M3 [..., K]; scales [..., ceil(K/G)], U8 E8M0 (K % 32 == 0) or F32 (a partial last
group zero-padded for its amax).  A program quantizes BLOCK_M rows x GROUPS groups.  Bit for bit with
:func:`formats.mxfp8.quantize` (stochastic: keyed on the flat index plus ``rounding.offset``) and
:func:`formats.fp8_block.quantize_act`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...formats import e8m0, fp8_block, mxfp8
from ...formats.rounding import NEAREST, Rounding
from .. import dispatch
from ..triton_numerics import (
    PRIORITY,
    abs_max,
    available,
    cdiv,
    check_input,
    divide,
    e4m3_code,
    e8m0_exponent,
    fp8_block_scale,
    hw_e4m3,
    next_pow2,
    pdl_enter,
    pdl_ok,
    pow2,
    random20,
    stream_key_i32,
    wraps,
)

MODE_MX, MODE_FLOAT, MODE_UE8M0 = 0, 1, 2  # the kernel's MODE
# Launch configs that quantkit bench formats --sweep times, row 0 the default; all give the same bytes.
# tile = (rows, groups) a program, cut to the tensor's size.
MX_TUNING: tuple[dict, ...] = (
    {"tile": (4, 32), "num_warps": 4},  # default: the fastest on the H200 for GPT-OSS-120B experts
    {"tile": (16, 8), "num_warps": 4},  # the same 4096 elements in shorter row segments
    {"tile": (32, 8), "num_warps": 8},  # twice the elements, half the programs
    {"tile": (8, 16), "num_warps": 4},  # between the first two
    {"tile": (64, 4), "num_warps": 8},  # the shortest row segments
    {"tile": (16, 8), "num_warps": 4, "hw_cast": False},  # the assembled E4M3 byte, against the hardware cast
)
ACT_TUNING: tuple[dict, ...] = (
    {"tile": (8, 4), "num_warps": 4},  # default: 4096 elements a program
    {"tile": (4, 8), "num_warps": 4},  # the same in longer row segments
    {"tile": (16, 4), "num_warps": 8},  # twice the elements, half the programs
    {"tile": (1, 8), "num_warps": 4},  # one row a program
    {"tile": (32, 1), "num_warps": 4},  # one group a program
    {"tile": (8, 4), "num_warps": 4, "hw_cast": False},  # the assembled E4M3 byte, against the hardware cast
)


@triton.jit
def store_scales(s_ptr, s_out, rows, grps, M, n_groups, ss_m, ss_g, m_pad, last):
    """Store scales [BM, GR] at strides (ss_m, ss_g); MN-major, the ``last`` program zeroes the padding columns too."""
    gmask = grps < n_groups
    tl.store(s_ptr + rows[:, None] * ss_m + grps[None, :] * ss_g, s_out, mask=(rows < M)[:, None] & gmask[None, :])
    if last & (m_pad > M):
        pr = M + tl.arange(0, 4).to(tl.int64)
        zero = (pr[:, None] * 0 + grps[None, :] * 0).to(s_out.dtype)
        tl.store(s_ptr + pr[:, None] * ss_m + grps[None, :] * ss_g, zero, mask=(pr < m_pad)[:, None] & gmask[None, :])


def quant_outputs(
    lead: tuple[int, ...], k: int, group: int, scale_dtype: torch.dtype, device: torch.device, scale_mn: bool = False
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """E4M3 [*lead, K], scales [*lead, ceil(K/group)] and the scales' layout for :func:`store_scales`."""
    n_groups, m = cdiv(k, group), math.prod(lead)
    q = torch.empty((*lead, k), dtype=torch.float8_e4m3fn, device=device)
    if scale_mn:
        rows = fp8_block.mn_rows(m)
        return q, fp8_block.empty_act_scales(lead, n_groups, device, True), (1, rows, rows)
    return q, torch.empty((*lead, n_groups), dtype=scale_dtype, device=device), (n_groups, 1, m)


@triton.jit(do_not_specialize=["k0", "k1", "offset", "m_pad"])
def _group_quant_kernel(
    x_ptr, q_ptr, s_ptr, live_ptr, M, K, n_groups, k0, k1, offset, ss_m, ss_g, m_pad,
    G: tl.constexpr, BLOCK_M: tl.constexpr, GROUPS: tl.constexpr,
    MODE: tl.constexpr, RCEIL: tl.constexpr, STOCHASTIC: tl.constexpr, HW_CAST: tl.constexpr, WRAP: tl.constexpr,
    LIVE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
    row0 = tl.program_id(0).to(tl.int64) * BLOCK_M
    grp0 = tl.program_id(1) * GROUPS
    base = row0 * K + grp0 * G  # int64; offsets inside the tile stay int32
    r = tl.arange(0, BLOCK_M)
    g = tl.arange(0, GROUPS)
    cols = g[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GR, G]
    mask = (r[:, None, None] < M - row0) & (cols < K - grp0 * G)
    off = r[:, None, None] * K + cols
    live = mask
    if LIVE:  # rows at or past *live_ptr quantize as zeros, unread
        live = mask & (r[:, None, None] < tl.load(live_ptr) - row0)
    x = tl.load(x_ptr + base + off, mask=live, other=0.0).to(tl.float32)

    amax = abs_max(x, 2)  # [BM, GR]
    if MODE == 0:
        k = e8m0_exponent(amax, 8, 0x600000, RCEIL)
        s = pow2(tl.minimum(k, 127))
        inv = pow2(-tl.minimum(k, 127))
        s_out = (k + 127).to(tl.uint8)  # NaN/Inf (k = 128) -> 0xFF
    else:
        s = fp8_block_scale(amax, MODE == 2, RCEIL)
        inv = tl.math.div_rn(1.0, s)  # once per group
        s_out = s
    v = divide(x, s[:, :, None], inv[:, :, None], MODE != 1)
    rnd = tl.zeros_like(off).to(tl.uint32)
    if STOCHASTIC:
        rnd = random20(base + offset, off, k0, k1, WRAP)
    tl.store(q_ptr + base + off, e4m3_code(v, rnd, STOCHASTIC, HW_CAST), mask=mask)
    last = tl.program_id(0) == tl.num_programs(0) - 1
    store_scales(s_ptr, s_out, row0 + r, grp0 + g, M, n_groups, ss_m, ss_g, m_pad, last)


def _launch(
    x: torch.Tensor, group: int, mode: int, rule: str, rounding: Rounding, scale_dtype: torch.dtype,
    tile: tuple[int, int], num_warps: int, hw_cast: bool | None, pdl: bool = False, scale_mn: bool = False,
    live_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    e8m0.check_rule(rule)
    check_input(x, "group quantization input")
    assert x.dim() >= 1, "group quantization needs at least one dim (K)"
    assert group >= 16 and group & (group - 1) == 0, f"group must be a power of two >= 16, got {group}"
    live_ok = live_rows is None or (live_rows.dtype == torch.int32 and live_rows.numel() == 1 and live_rows.device == x.device)
    assert live_ok, "live_rows: int32 [1] on x's device"
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    n_groups = cdiv(k, group)
    q, s, s_strides = quant_outputs(tuple(x.shape[:-1]), k, group, scale_dtype, x.device, scale_mn)
    block_m = min(tile[0], next_pow2(max(m, 1)))
    groups = min(tile[1], next_pow2(max(n_groups, 1)))
    k0, k1 = stream_key_i32(rounding)
    pdl = pdl_ok(x.device, pdl)
    if m and k:
        grid = (cdiv(m, block_m), cdiv(n_groups, groups))
        _group_quant_kernel[grid](
            x, q.view(torch.uint8), s, x if live_rows is None else live_rows, m, k, n_groups, k0, k1, rounding.offset, *s_strides,
            G=group, BLOCK_M=block_m, GROUPS=groups, MODE=mode, RCEIL=rule == "rceil",
            STOCHASTIC=rounding.stochastic, WRAP=rounding.stochastic and wraps(rounding.offset, x.numel()), HW_CAST=hw_e4m3(x.device, hw_cast),
            LIVE=live_rows is not None, PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
        )  # fmt: skip
    return q, s


@dispatch.backend("act_quant_mxfp8", "triton", available=available, priority=PRIORITY)
@dispatch.backend("mxfp8_quantize", "triton", available=available, priority=PRIORITY)
def mxfp8_quantize(
    x: torch.Tensor,
    rule: str = e8m0.DEFAULT_RULE,
    rounding: Rounding = NEAREST,
    *,
    tile: tuple[int, int] = (4, 32),
    num_warps: int = 4,
    hw_cast: bool | None = None,
    pdl: bool = False,
    live_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (F8_E4M3 [..., K], U8 E8M0 [..., K/32]), launched as an :data:`MX_TUNING` row; ``live_rows``:
    int32 [1] on x's device, rows at or past it quantize as zeros unread (an MoE buffer's spare rows)."""
    k = x.shape[-1]
    if k % mxfp8.BLOCK:
        raise ValueError(f"MXFP8 needs K to be a multiple of {mxfp8.BLOCK}, got {k}")
    return _launch(x, mxfp8.BLOCK, MODE_MX, rule, rounding, torch.uint8, tile, num_warps, hw_cast, pdl, live_rows=live_rows)


@dispatch.backend("act_quant_fp8_block", "triton", available=available, priority=PRIORITY)
def act_quant_fp8_block(
    x: torch.Tensor,
    scale_fmt: str = "float",
    rule: str = e8m0.DEFAULT_RULE,
    group: int = fp8_block.BLOCK,
    *,
    tile: tuple[int, int] = (8, 4),
    num_warps: int = 4,
    hw_cast: bool | None = None,
    pdl: bool = False,
    scale_mn: bool = False,
    live_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (F8_E4M3 [..., K], F32 [..., ceil(K/group)]), DeepSeek act_quant; else as :func:`mxfp8_quantize`."""
    if scale_fmt not in fp8_block.SCALE_FMTS:
        raise ValueError(f"scale format must be one of {fp8_block.SCALE_FMTS}, not {scale_fmt!r}")
    mode = MODE_UE8M0 if scale_fmt == "ue8m0" else MODE_FLOAT
    return _launch(x, group, mode, rule, NEAREST, torch.float32, tile, num_warps, hw_cast, pdl, scale_mn, live_rows)
