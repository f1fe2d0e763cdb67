"""Triton 1xG group quantization along K: MXFP8 (G = 32, E8M0 scales; weights and activations)
and DeepSeek's per-token per-128 activation quantization (``act_quant``, F32 or UE8M0 scales).

Layout: x [..., K] is read as [M, K] (leading dims flattened, contiguous); q E4M3 [..., K];
scales [..., ceil(K/G)], U8 E8M0 for MXFP8 (compressed-tensors ``weight_scale``, K % 32 == 0)
and F32 for fp8-block (DeepSeek inference/kernel.py act_quant; a partial last group is
zero-padded for its amax).  Each program quantizes a [BLOCK_M, GROUPS, G] tile: BLOCK_M rows
and GROUPS consecutive groups of each row, so every row segment it touches is contiguous.

Numerics, bit for bit (MODE picks the scale):
* MODE_MX, :func:`formats.mxfp8.quantize`: k = exponent(amax, e4m3, rule), byte k + 127
  (0xFF for NaN/Inf), q = e4m3(x / 2**min(k, 127)), nearest or stochastic (uniform of the
  element's flat index in the whole tensor plus ``rounding.offset``);
* MODE_FLOAT / MODE_UE8M0, :func:`formats.fp8_block.quantize_act`: amax floored at 1e-4,
  s = div_rn(amax, 448) or 2**exponent(amax, e4m3, rule), q = e4m3(x / s) (nearest);
x / s is the IEEE quotient (triton_numerics.divide).
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

MODE_MX, MODE_FLOAT, MODE_UE8M0 = 0, 1, 2  # the kernel's MODE (compared as literals inside it)
# launch configurations scripts/bench_formats.py sweeps (the first is the default); all give the same
# bytes.  tile = (rows, groups) per program, each cut down to the tensor's size.
MX_TUNING: tuple[dict, ...] = (
    {"tile": (4, 32), "num_warps": 4},  # H200, GPT-OSS-120B experts: 1.66 ms vs 2.23 for (16, 8) (nearest)
    {"tile": (16, 8), "num_warps": 4},
    {"tile": (32, 8), "num_warps": 8},
    {"tile": (8, 16), "num_warps": 4},
    {"tile": (64, 4), "num_warps": 8},
    {"tile": (16, 8), "num_warps": 4, "hw_cast": False},  # the assembled E4M3 byte, for comparison
)
ACT_TUNING: tuple[dict, ...] = (
    {"tile": (8, 4), "num_warps": 4},
    {"tile": (4, 8), "num_warps": 4},
    {"tile": (16, 4), "num_warps": 8},
    {"tile": (1, 8), "num_warps": 4},
    {"tile": (32, 1), "num_warps": 4},
    {"tile": (8, 4), "num_warps": 4, "hw_cast": False},
)


@triton.jit
def store_scales(s_ptr, s_out, rows, grps, M, n_groups, ss_m, ss_g, m_pad, last):
    """Store scales s_out [BM, GR] of rows [BM] (int64) x groups [GR] at strides (ss_m, ss_g): contiguous
    (n_groups, 1) or MN-major (1, m_pad).  MN-major with padding (m_pad > M): the ``last`` row program
    also zeroes the padding columns M..m_pad-1 of its groups (fewer than 4)."""
    gmask = grps < n_groups
    tl.store(s_ptr + rows[:, None] * ss_m + grps[None, :] * ss_g, s_out, mask=(rows < M)[:, None] & gmask[None, :])
    if last & (m_pad > M):
        pr = M + tl.arange(0, 4).to(tl.int64)
        zero = (pr[:, None] * 0 + grps[None, :] * 0).to(s_out.dtype)
        tl.store(s_ptr + pr[:, None] * ss_m + grps[None, :] * ss_g, zero, mask=(pr < m_pad)[:, None] & gmask[None, :])


def quant_outputs(
    lead: tuple[int, ...], k: int, group: int, scale_dtype: torch.dtype, device: torch.device, scale_mn: bool = False
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """E4M3 [*lead, K] and scales [*lead, ceil(K/group)] for a quantizer to fill -- contiguous, or F32 MN-major
    (:func:`quantkit.formats.fp8_block.empty_act_scales`) -- and the scales' (row stride, group stride, padded
    rows) as :func:`store_scales` takes them."""
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
    base = row0 * K + grp0 * G  # flat index of the tile's first element, int64
    r = tl.arange(0, BLOCK_M)
    g = tl.arange(0, GROUPS)
    cols = g[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GR, G], int32 from the tile start
    mask = (r[:, None, None] < M - row0) & (cols < K - grp0 * G)
    off = r[:, None, None] * K + cols  # int32 offsets inside the tile
    live = mask
    if LIVE:  # rows at or past *live_ptr are not read: they quantize as zeros (an MoE buffer's unused capacity)
        live = mask & (r[:, None, None] < tl.load(live_ptr) - row0)
    x = tl.load(x_ptr + base + off, mask=live, other=0.0).to(tl.float32)

    amax = abs_max(x, 2)  # [BM, GR]
    if MODE == 0:
        k = e8m0_exponent(amax, 8, 0x600000, RCEIL)
        s = pow2(tl.minimum(k, 127))
        inv = pow2(-tl.minimum(k, 127))  # exact: k >= -127
        s_out = (k + 127).to(tl.uint8)  # k in [-127, 128]: 128 -> 0xFF
    else:
        s = fp8_block_scale(amax, MODE == 2, RCEIL)
        inv = tl.math.div_rn(1.0, s)  # once per group, before broadcasting
        s_out = s
    v = divide(x, s[:, :, None], inv[:, :, None], MODE != 1)
    rnd = tl.zeros_like(off).to(tl.uint32)  # unused when rounding to nearest
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
    q, s, s_strides = quant_outputs(tuple(x.shape[:-1]), k, group, scale_dtype, x.device, scale_mn)  # [..., K], [..., ceil(K/G)]
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
    """[..., K] -> (F8_E4M3 [..., K], U8 E8M0 [..., K/32]).

    ``tile`` = (rows, groups) per program; ``hw_cast``: E4M3 by the hardware cast (None: where exact);
    ``pdl``: launched as a programmatic dependent (:func:`.triton_numerics.pdl_enter`; compiled sm_90+ only);
    ``live_rows``: int32 [1] on x's device, read there (no host sync): the (flattened) rows at or past it are not
    read and quantize as zeros -- an MoE buffer's capacity past its alignment's ``num_padded``, never written.
    """
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
    """[..., K] -> (F8_E4M3 [..., K], F32 scales [..., ceil(K/group)]), DeepSeek act_quant; ``pdl`` and ``live_rows``
    as in :func:`mxfp8_quantize`; ``scale_mn``: the scales MN-major (:func:`quantkit.formats.fp8_block.empty_act_scales`)."""
    if scale_fmt not in fp8_block.SCALE_FMTS:
        raise ValueError(f"scale format must be one of {fp8_block.SCALE_FMTS}, not {scale_fmt!r}")
    mode = MODE_UE8M0 if scale_fmt == "ue8m0" else MODE_FLOAT
    return _launch(x, group, mode, rule, NEAREST, torch.float32, tile, num_warps, hw_cast, pdl, scale_mn, live_rows)
