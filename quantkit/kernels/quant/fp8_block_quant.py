"""Triton FP8 128x128 block weight quantization, one program per tile; leading dims are batch dims.

Bit for bit with :func:`formats.fp8_block.quantize_weight` (HF fine-grained FP8, DeepSeek-V3 README_WEIGHTS.md):

    amax = max(max|x| over the tile zero-padded, 1e-4)               (NaN anywhere -> NaN)
    s    = div_rn(amax, 448) | 2**exponent(amax, e4m3, rule)       (scale_fmt float | ue8m0)
    q    = e4m3(x / s), nearest or stochastic keyed on the flat index plus ``rounding.offset``
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import e8m0, fp8_block
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
    fp8_block_scale,
    hw_e4m3,
    random20,
    stream_key_i32,
    wraps,
)

# Launch configs that quantkit bench formats --sweep times, row 0 the default (SR_TUNING: stochastic); all give the same bytes.
TUNING: tuple[dict, ...] = (
    {"num_warps": 8},  # default: one pass (rows unset), the tile in registers
    {"num_warps": 4},  # more registers a thread
    {"num_warps": 16},  # more loads in flight
    {"num_warps": 8, "hw_cast": False},  # the assembled E4M3 byte, against the hardware cast
)
SR_TUNING: tuple[dict, ...] = (
    {"num_warps": 4, "rows": 16},  # default: 16-row bands keep stochastic rounding's arithmetic from spilling
    {"num_warps": 8, "rows": 32},  # wider bands, more warps
    {"num_warps": 4, "rows": 32},  # wider bands
    {"num_warps": 8, "rows": 16},  # more warps
)


@triton.jit
def _band(r0, ROWS: tl.constexpr, BLOCK: tl.constexpr, n_rows, n_cols, K):
    """Rows [r0, r0 + ROWS) of a tile: (offsets, mask)."""
    r = r0 + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    return r[:, None] * K + c[None, :], (r[:, None] < n_rows) & (c[None, :] < n_cols)


@triton.jit(do_not_specialize=["k0", "k1", "offset"])
def _fp8_block_quant_kernel(
    x_ptr, q_ptr, s_ptr, N, K, tiles_n, tiles_k, k0, k1, offset,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, UE8M0: tl.constexpr, RCEIL: tl.constexpr,
    STOCHASTIC: tl.constexpr, HW_CAST: tl.constexpr, WRAP: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    per_mat = tiles_n * tiles_k
    tn = (pid % per_mat) // tiles_k
    tk = pid % tiles_k
    base = (pid // per_mat) * N * K + tn * BLOCK * K + tk * BLOCK  # int64
    n_rows, n_cols = N - tn * BLOCK, K - tk * BLOCK
    if ROWS == BLOCK:
        off, mask = _band(0, ROWS, BLOCK, n_rows, n_cols, K)
        x = tl.load(x_ptr + base + off, mask=mask, other=0.0).to(tl.float32)
        s = fp8_block_scale(abs_max(abs_max(x, 1), 0), UE8M0, RCEIL)
        v = divide(x, s, tl.math.div_rn(1.0, s), UE8M0)
        rnd = tl.zeros_like(off).to(tl.uint32)
        if STOCHASTIC:
            rnd = random20(base + offset, off, k0, k1, WRAP)
        tl.store(q_ptr + base + off, e4m3_code(v, rnd, STOCHASTIC, HW_CAST), mask=mask)
    else:  # two passes over row bands, the second reading from L2
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.int32)
        for r0 in range(0, BLOCK, ROWS):
            off, mask = _band(r0, ROWS, BLOCK, n_rows, n_cols, K)
            x = tl.load(x_ptr + base + off, mask=mask, other=0.0).to(tl.float32)
            acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)  # as abs_max
        amax = tl.max(tl.max(acc, 1), 0).to(tl.float32, bitcast=True)
        s = fp8_block_scale(amax, UE8M0, RCEIL)
        inv = tl.math.div_rn(1.0, s)
        for r0 in range(0, BLOCK, ROWS):
            off, mask = _band(r0, ROWS, BLOCK, n_rows, n_cols, K)
            x = tl.load(x_ptr + base + off, mask=mask, other=0.0).to(tl.float32)
            v = divide(x, s, inv, UE8M0)
            rnd = tl.zeros_like(off).to(tl.uint32)
            if STOCHASTIC:
                rnd = random20(base + offset, off, k0, k1, WRAP)
            tl.store(q_ptr + base + off, e4m3_code(v, rnd, STOCHASTIC, HW_CAST), mask=mask)
    tl.store(s_ptr + pid, s)


@dispatch.backend("fp8_block_quantize_weight", "triton", available=available, priority=PRIORITY)
def quantize_weight(
    w: torch.Tensor,
    scale_fmt: str = "float",
    rule: str = e8m0.DEFAULT_RULE,
    rounding: Rounding = NEAREST,
    block: int = fp8_block.BLOCK,
    *,
    num_warps: int | None = None,
    rows: int | None = None,
    hw_cast: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] -> (F8_E4M3 [..., N, K], F32 scale_inv [..., ceil(N/128), ceil(K/128)]); ``num_warps``, ``rows``:
    a tuning row (None: the default)."""
    if scale_fmt not in fp8_block.SCALE_FMTS:
        raise ValueError(f"scale format must be one of {fp8_block.SCALE_FMTS}, not {scale_fmt!r}")
    e8m0.check_rule(rule)
    assert w.dim() >= 2, f"fp8-block weight must be [..., N, K], got {tuple(w.shape)}"
    assert block in (32, 64, 128), f"tile size must be a power of two <= 128, got {block}"
    check_input(w, "fp8-block weight")
    n, k = w.shape[-2:]
    tiles_n, tiles_k = cdiv(n, block), cdiv(k, block)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)  # [..., N, K]
    s = torch.empty((*w.shape[:-2], tiles_n, tiles_k), dtype=torch.float32, device=w.device)  # [..., tn, tk]
    k0, k1 = stream_key_i32(rounding)
    conf = {"rows": block, **(SR_TUNING[0] if rounding.stochastic else TUNING[0])}
    num_warps = conf["num_warps"] if num_warps is None else num_warps
    rows = min(conf["rows"] if rows is None else rows, block)
    if s.numel():
        _fp8_block_quant_kernel[(s.numel(),)](
            w, q.view(torch.uint8), s, n, k, tiles_n, tiles_k, k0, k1, rounding.offset,
            BLOCK=block, ROWS=rows, UE8M0=scale_fmt == "ue8m0", RCEIL=rule == "rceil", STOCHASTIC=rounding.stochastic, WRAP=rounding.stochastic and wraps(rounding.offset, w.numel()),
            HW_CAST=hw_e4m3(w.device, hw_cast), num_warps=num_warps,
        )  # fmt: skip
    return q, s
