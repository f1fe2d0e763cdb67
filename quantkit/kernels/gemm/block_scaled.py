"""Triton block-scaled FP8 GEMM, tiled (large M): C = dequant(X) @ dequant(Y).T (+ bias), float32 accumulation.

Operands are :class:`Side` s: E4M3 rows [rows, K] plus a scale grid, one scale per ``rps`` rows x ``kps`` columns, F32
or U8 E8M0 (FP8-block: activations 1x128, weights 128x128, as DeepSeek-V3's ``fp8_gemm``; MXFP8: 1x32).  Each 128-deep
K step runs as sub-blocks of min(kps) columns; each sub-block's fp8 dot is promoted into the float32 accumulator times
both scales (the tensor core's own accumulation spans one scale block only).  ``upcast`` instead multiplies the E4M3
tiles by their power-of-two scales in bf16, exactly, for one bf16 dot.  A partial last K block is masked (TMA
zero-fills it); rows need not fill a tile.

Launch options (:class:`Config`): grouped tile order (tiles sharing a column tile run while it is in L2), TMA loads
(16-byte aligned rows), persistent programs (TMA only), split-K with a deterministic reduction through a
:class:`Workspace`, so a launch allocates only its output and is CUDA-graph safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..dispatch import sm_count
from ..triton_numerics import cdiv, e8m0_decode, interpreted

BLOCK_K = 128
INT32_LIMIT = 2**31


class Side(NamedTuple):
    """E4M3 ``q`` [rows, K]; ``s`` [ceil(rows/rps), ceil(K/kps)] F32 or U8 E8M0; ``pow2``: F32 scales are powers of two."""

    q: torch.Tensor
    s: torch.Tensor
    rps: int
    kps: int
    pow2: bool = False


class Workspace:
    """Split-K scratch per device: float32 partial tiles and int32 arrival counters.  The last program of each tile
    zeroes its counter, so launches need no memset; buffers only grow (a replaced one is kept alive for graphs that
    captured it), and growing during a graph capture raises: warm up first.  Launches on concurrent streams need one
    each."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, str, int | None], torch.Tensor] = {}
        self._retired: list[torch.Tensor] = []

    def partials(self, numel: int, device: torch.device) -> torch.Tensor:
        return self._get("part", numel, torch.float32, device)

    def counters(self, numel: int, device: torch.device) -> torch.Tensor:
        return self._get("count", numel, torch.int32, device)

    @staticmethod
    def _device_key(device: torch.device) -> tuple[str, int | None]:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            return ("cuda", torch.cuda.current_device())
        return (device.type, device.index)

    def _get(self, kind: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (kind, *self._device_key(device))
        buf = self._bufs.get(key)
        if buf is not None and buf.numel() >= numel:
            return buf
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"split-K workspace ({kind}, {numel} elements) must grow during a CUDA graph capture: run the GEMM once before capturing")
        if buf is not None:
            self._retired.append(buf)
            numel = max(numel, 2 * buf.numel())
        buf = torch.zeros(numel, dtype=dtype, device=device)  # counters start at zero
        self._bufs[key] = buf
        return buf


WORKSPACE = Workspace()


@dataclass(frozen=True)
class Config:
    """One tiled launch; ``split_k`` 0: from the SM count; ``persistent`` n: n programs per SM loop over the tiles."""

    block_m: int
    block_n: int
    group: int = 8
    split_k: int = 1
    swap_ab: bool = False
    upcast: bool = False
    tma: bool = False
    persistent: int = 0
    num_warps: int = 4
    num_stages: int = 3

    def __str__(self) -> str:
        return self.name()

    def name(self) -> str:
        flags = ("swap" if self.swap_ab else "") + ("+up" if self.upcast else "") + ("+tma" if self.tma else "")
        flags += f"+pers{self.persistent}" if self.persistent else ""
        flags += f"+g{self.group}" if self.group != 8 else ""
        return f"{self.block_m}x{self.block_n}/s{self.split_k}/w{self.num_warps}/st{self.num_stages}{'/' + flags if flags else ''}"


@triton.jit
def tile_coords(pid, P, Q, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, GROUP_P: tl.constexpr):
    """Grouped order: GROUP_P P-tiles share each Q-tile while it is in L2."""
    n_p = tl.cdiv(P, BLOCK_P)
    n_q = tl.cdiv(Q, BLOCK_Q)
    width = GROUP_P * n_q
    first = (pid // width) * GROUP_P
    size = tl.minimum(n_p - first, GROUP_P)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def side_scale(s_ptr, rows, row0, kcol, n_kcols, stride_r, stride_k, RPS: tl.constexpr, BLOCK: tl.constexpr, E8M0: tl.constexpr):
    """Scales of one sub-block: a scalar when the whole tile shares a scale row, else [BLOCK]."""
    if RPS % BLOCK == 0:
        s = tl.load(s_ptr + (row0 // RPS) * stride_r + kcol * stride_k, mask=kcol < n_kcols, other=0)
    else:
        s = tl.load(s_ptr + (rows // RPS) * stride_r + kcol * stride_k, mask=(rows * 0 + kcol) < n_kcols, other=0)
    if E8M0:
        s = e8m0_decode(s.to(tl.int32))
    return s


@triton.jit
def promote(acc, d, xs, ys, X_UNIFORM: tl.constexpr, Y_UNIFORM: tl.constexpr):
    """acc += d * xs (rows) * ys (columns); a uniform side is a scalar."""
    if X_UNIFORM:
        if Y_UNIFORM:
            acc += d * (xs * ys)
        else:
            acc += d * (ys * xs)[None, :]
    else:
        if Y_UNIFORM:
            acc += d * (xs * ys)[:, None]
        else:
            acc += d * (xs[:, None] * ys[None, :])
    return acc


@triton.jit
def split_reduce_pair(acc, acc2, part_ptr, count_ptr, tile, n_tiles, split, n_split, PAIR: tl.constexpr,
                      BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):  # fmt: skip
    """Deterministic split-K (CUTLASS's semaphore): store this split's partial (with PAIR a second beside it) at
    part[split, tile]; the last to arrive sums all in split order and zeroes the counter.  (is_last, sum, sum2)."""
    HALVES: tl.constexpr = 2 if PAIR else 1
    size: tl.constexpr = BLOCK_A * BLOCK_B
    loc = tl.arange(0, BLOCK_A)[:, None] * BLOCK_B + tl.arange(0, BLOCK_B)[None, :]
    base = part_ptr + tile.to(tl.int64) * (HALVES * size)
    stride = n_tiles.to(tl.int64) * (HALVES * size)
    tl.store(base + split * stride + loc, acc)
    if PAIR:
        tl.store(base + split * stride + size + loc, acc2)
    tl.debug_barrier()  # every thread's partial is written before the counter is released
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    last = arrived == n_split - 1
    total = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.float32)
    total2 = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.float32)
    if last:
        for s in range(0, n_split):
            total += tl.load(base + s * stride + loc, cache_modifier=".cg")
            if PAIR:
                total2 += tl.load(base + s * stride + size + loc, cache_modifier=".cg")
        tl.store(count_ptr + tile, 0)  # for the next launch and every graph replay
    return last, total, total2


@triton.jit
def split_reduce(acc, part_ptr, count_ptr, tile, n_tiles, split, n_split, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """:func:`split_reduce_pair` of one accumulator: (is_last, sum)."""
    last, total, _ = split_reduce_pair(acc, acc, part_ptr, count_ptr, tile, n_tiles, split, n_split, False, BLOCK_A, BLOCK_B)
    return last, total


@triton.jit
def _store_out(acc, c_ptr, bias_ptr, offs_p, offs_q, P, Q, scp, scq, HAS_BIAS: tl.constexpr, BIAS_ON_P: tl.constexpr):
    if HAS_BIAS:
        if BIAS_ON_P:
            acc += tl.load(bias_ptr + offs_p, mask=offs_p < P, other=0.0).to(tl.float32)[:, None]
        else:
            acc += tl.load(bias_ptr + offs_q, mask=offs_q < Q, other=0.0).to(tl.float32)[None, :]
    mask = (offs_p < P)[:, None] & (offs_q < Q)[None, :]
    tl.store(c_ptr + offs_p[:, None] * scp + offs_q[None, :] * scq, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile_step(acc, x_ptr, xs_ptr, y_ptr, ys_ptr, x_desc, y_desc, rows_x, rows_y, p0, q0, kb, K, XS_COLS, YS_COLS,
               sxp, sxsp, sxsk, syq, sysq, sysk,
               X_RPS: tl.constexpr, X_KPS: tl.constexpr, X_E8M0: tl.constexpr, Y_RPS: tl.constexpr, Y_KPS: tl.constexpr, Y_E8M0: tl.constexpr,
               BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
               MASKED: tl.constexpr, USE_TMA: tl.constexpr, UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr):  # fmt: skip
    """One BLOCK_K step: each SUB_K sub-block's dot promoted with its scales."""
    X_UNIFORM: tl.constexpr = X_RPS % BLOCK_P == 0
    Y_UNIFORM: tl.constexpr = Y_RPS % BLOCK_Q == 0
    offs_s = tl.arange(0, SUB_K)
    for j in tl.static_range(BLOCK_K // SUB_K):
        k0 = kb * BLOCK_K + j * SUB_K
        if USE_TMA:  # out-of-range rows and columns arrive as zeros
            x = x_desc.load([p0, k0])  # [BP, SUB_K]
            y = y_desc.load([q0, k0]).T  # [SUB_K, BQ]
        else:
            x_ptrs = x_ptr + rows_x[:, None] * sxp + (k0 + offs_s)[None, :]  # [BP, SUB_K]
            y_ptrs = y_ptr + (k0 + offs_s)[:, None] + rows_y[None, :] * syq  # [SUB_K, BQ]
            if MASKED:
                kmask = (k0 + offs_s) < K
                x = tl.load(x_ptrs, mask=kmask[None, :], other=0.0)
                y = tl.load(y_ptrs, mask=kmask[:, None], other=0.0)
            else:
                x = tl.load(x_ptrs)
                y = tl.load(y_ptrs)
        xcol = kb * (BLOCK_K // X_KPS) + (j * SUB_K) // X_KPS
        ycol = kb * (BLOCK_K // Y_KPS) + (j * SUB_K) // Y_KPS
        xs = side_scale(xs_ptr, rows_x, p0, xcol, XS_COLS, sxsp, sxsk, X_RPS, BLOCK_P, X_E8M0)
        ys = side_scale(ys_ptr, rows_y, q0, ycol, YS_COLS, sysq, sysk, Y_RPS, BLOCK_Q, Y_E8M0)
        if UPCAST:  # E4M3 * 2**k is exact in bf16
            if X_UNIFORM:
                xb = (x.to(tl.float32) * xs).to(UP_DTYPE)
            else:
                xb = (x.to(tl.float32) * xs[:, None]).to(UP_DTYPE)
            if Y_UNIFORM:
                yb = (y.to(tl.float32) * ys).to(UP_DTYPE)
            else:
                yb = (y.to(tl.float32) * ys[None, :]).to(UP_DTYPE)
            acc = tl.dot(xb, yb, acc)
        else:
            acc = promote(acc, tl.dot(x, y), xs, ys, X_UNIFORM, Y_UNIFORM)
    return acc


@triton.jit  # integers specialised (divisibility by 16): unspecialised they run 4-40% slower
def _tiled_kernel(
    x_ptr, xs_ptr, y_ptr, ys_ptr, c_ptr, bias_ptr, part_ptr, count_ptr, x_desc, y_desc,
    P, Q, K, XS_COLS, YS_COLS, kb_per_split,
    sxp, sxsp, sxsk, syq, sysq, sysk, scp, scq,
    X_RPS: tl.constexpr, X_KPS: tl.constexpr, X_E8M0: tl.constexpr,
    Y_RPS: tl.constexpr, Y_KPS: tl.constexpr, Y_E8M0: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_ON_P: tl.constexpr, UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
    GROUP_P: tl.constexpr, HAS_SPLIT: tl.constexpr, USE_TMA: tl.constexpr, PERSISTENT: tl.constexpr,
):  # fmt: skip
    """C[P, Q] = X[P, K] @ Y[Q, K].T."""
    n_kb = tl.cdiv(K, BLOCK_K)
    n_full = K // BLOCK_K
    if PERSISTENT:  # Triton's persistent-matmul tutorial loop; TMA: every step unmasked
        n_tiles = tl.cdiv(P, BLOCK_P) * tl.cdiv(Q, BLOCK_Q)
        t_out = tl.program_id(0) - tl.num_programs(0)  # the epilogue's own tile counter, as in the tutorial
        for t in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), flatten=True):
            pid_p, pid_q = tile_coords(t, P, Q, BLOCK_P, BLOCK_Q, GROUP_P)
            rows_x = tl.minimum(pid_p * BLOCK_P + tl.arange(0, BLOCK_P), P - 1)
            rows_y = tl.minimum(pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q), Q - 1)
            acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
            for kb in range(0, n_kb):
                acc = _tile_step(acc, x_ptr, xs_ptr, y_ptr, ys_ptr, x_desc, y_desc, rows_x, rows_y, pid_p * BLOCK_P, pid_q * BLOCK_Q, kb, K, XS_COLS, YS_COLS,
                                 sxp, sxsp, sxsk, syq, sysq, sysk, X_RPS, X_KPS, X_E8M0, Y_RPS, Y_KPS, Y_E8M0,
                                 BLOCK_P, BLOCK_Q, BLOCK_K, SUB_K, False, True, UPCAST, UP_DTYPE)  # fmt: skip
            t_out += tl.num_programs(0)
            out_p, out_q = tile_coords(t_out, P, Q, BLOCK_P, BLOCK_Q, GROUP_P)
            offs_p = out_p * BLOCK_P + tl.arange(0, BLOCK_P)
            offs_q = out_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
            _store_out(acc, c_ptr, bias_ptr, offs_p, offs_q, P, Q, scp, scq, HAS_BIAS, BIAS_ON_P)
    else:
        pid = tl.program_id(0)
        split = tl.program_id(1)
        pid_p, pid_q = tile_coords(pid, P, Q, BLOCK_P, BLOCK_Q, GROUP_P)
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows_x = tl.minimum(offs_p, P - 1)  # out-of-range rows re-read a valid one; never stored
        rows_y = tl.minimum(offs_q, Q - 1)
        kb_lo = split * kb_per_split
        kb_hi = tl.minimum(kb_lo + kb_per_split, n_kb)
        acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
        last_full = kb_hi
        if not USE_TMA:
            last_full = tl.minimum(kb_hi, n_full)
        for kb in range(kb_lo, last_full):
            acc = _tile_step(acc, x_ptr, xs_ptr, y_ptr, ys_ptr, x_desc, y_desc, rows_x, rows_y, pid_p * BLOCK_P, pid_q * BLOCK_Q, kb, K, XS_COLS, YS_COLS,
                             sxp, sxsp, sxsk, syq, sysq, sysk, X_RPS, X_KPS, X_E8M0, Y_RPS, Y_KPS, Y_E8M0,
                             BLOCK_P, BLOCK_Q, BLOCK_K, SUB_K, False, USE_TMA, UPCAST, UP_DTYPE)  # fmt: skip
        if not USE_TMA:
            if (kb_hi > n_full) & (kb_lo <= n_full):  # this split holds the partial last block
                acc = _tile_step(acc, x_ptr, xs_ptr, y_ptr, ys_ptr, x_desc, y_desc, rows_x, rows_y, pid_p * BLOCK_P, pid_q * BLOCK_Q, n_full, K, XS_COLS, YS_COLS,
                                 sxp, sxsp, sxsk, syq, sysq, sysk, X_RPS, X_KPS, X_E8M0, Y_RPS, Y_KPS, Y_E8M0,
                                 BLOCK_P, BLOCK_Q, BLOCK_K, SUB_K, True, False, UPCAST, UP_DTYPE)  # fmt: skip
        if HAS_SPLIT:
            last, total = split_reduce(acc, part_ptr, count_ptr, pid, tl.num_programs(0), split, tl.num_programs(1), BLOCK_P, BLOCK_Q)
            if last:
                _store_out(total, c_ptr, bias_ptr, offs_p, offs_q, P, Q, scp, scq, HAS_BIAS, BIAS_ON_P)
        else:
            _store_out(acc, c_ptr, bias_ptr, offs_p, offs_q, P, Q, scp, scq, HAS_BIAS, BIAS_ON_P)


def auto_split(tiles: int, n_kb: int, sms: int) -> int:
    """Splits for about 2 waves of SMs, at least 2 K-blocks each."""
    want = cdiv(2 * sms, max(tiles, 1))
    return max(1, min(want, n_kb // 2, 16))


def split_plan(want: int, n_kb: int) -> tuple[int, int]:
    """(splits, K-blocks per split), none empty."""
    per = cdiv(n_kb, max(1, min(want, n_kb)))
    return cdiv(n_kb, per), per


def check_side(side: Side, what: str, k: int) -> None:
    rows, kk = side.q.shape
    assert side.q.dtype == torch.float8_e4m3fn, f"{what}: E4M3 elements needed, got {side.q.dtype}"
    assert side.q.stride(1) == 1, f"{what}: K must be the contiguous dim, strides {side.q.stride()}"
    assert kk == k > 0, f"{what}: K={kk}, the other operand has K={k}"
    want = (-(-rows // side.rps), -(-k // side.kps))
    assert tuple(side.s.shape) == want, f"{what}: scale grid {tuple(side.s.shape)}, expected {want} for {tuple(side.q.shape)}"
    assert side.s.dtype in (torch.float32, torch.uint8), f"{what}: scales must be F32 or U8 (E8M0), got {side.s.dtype}"
    assert BLOCK_K % side.kps == 0 and side.kps % 32 == 0, f"{what}: {side.kps} columns per scale do not tile {BLOCK_K}"
    assert side.q.numel() < INT32_LIMIT, f"{what}: {side.q.numel()} elements overflow 32-bit offsets"


def tma_ok(*qs: torch.Tensor) -> bool:
    return all(q.stride(0) % 16 == 0 and q.data_ptr() % 16 == 0 for q in qs)


def block_scaled_mm(a: Side, w: Side, bias: torch.Tensor | None, out_dtype: torch.dtype, cfg: Config, workspace: Workspace | None = None) -> torch.Tensor:
    """[M, K] tokens x [N, K] weight -> out_dtype [M, N]."""
    m, k = a.q.shape
    n = w.q.shape[0]
    check_side(a, "activation", k)
    check_side(w, "weight", k)
    assert bias is None or tuple(bias.shape) == (n,), f"bias must be [{n}], got {None if bias is None else tuple(bias.shape)}"
    assert not cfg.upcast or all(t.pow2 or t.s.dtype == torch.uint8 for t in (a, w)), "upcast is exact only with power-of-two scales"
    assert not cfg.persistent or (cfg.tma and cfg.split_k == 1), f"{cfg.name()}: persistent programs need TMA loads and no split-K"
    out = torch.empty((m, n), dtype=out_dtype, device=a.q.device)  # [M, N]
    if m == 0 or n == 0:
        return out
    x, y = (w, a) if cfg.swap_ab else (a, w)
    bp, bq = (cfg.block_n, cfg.block_m) if cfg.swap_ab else (cfg.block_m, cfg.block_n)
    (p, _), (q, _) = x.q.shape, y.q.shape
    scp, scq = (out.stride(1), out.stride(0)) if cfg.swap_ab else (out.stride(0), out.stride(1))
    ws = workspace or WORKSPACE
    tiles, n_kb = cdiv(p, bp) * cdiv(q, bq), cdiv(k, BLOCK_K)
    split, per = split_plan(cfg.split_k or auto_split(tiles, n_kb, sm_count(out.device)), n_kb)
    grid = (min(tiles, cfg.persistent * sm_count(out.device)), 1) if cfg.persistent else (tiles, split)
    part, count = (ws.partials(split * tiles * bp * bq, out.device), ws.counters(tiles, out.device)) if split > 1 else (out, out)
    sub_k = min(x.kps, y.kps)
    x_desc, y_desc = (_descriptor(x.q, bp, sub_k), _descriptor(y.q, bq, sub_k)) if cfg.tma else (None, None)
    _tiled_kernel[grid](
        x.q, x.s, y.q, y.s, out, bias if bias is not None else out, part, count, x_desc, y_desc,
        p, q, k, x.s.shape[1], y.s.shape[1], per,
        x.q.stride(0), x.s.stride(0), x.s.stride(1), y.q.stride(0), y.s.stride(0), y.s.stride(1), scp, scq,
        X_RPS=x.rps, X_KPS=x.kps, X_E8M0=x.s.dtype == torch.uint8,
        Y_RPS=y.rps, Y_KPS=y.kps, Y_E8M0=y.s.dtype == torch.uint8,
        HAS_BIAS=bias is not None, BIAS_ON_P=cfg.swap_ab, UPCAST=cfg.upcast, UP_DTYPE=upcast_dtype(),
        BLOCK_P=bp, BLOCK_Q=bq, BLOCK_K=BLOCK_K, SUB_K=sub_k,
        GROUP_P=cfg.group, HAS_SPLIT=split > 1, USE_TMA=cfg.tma, PERSISTENT=cfg.persistent > 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def _descriptor(q: torch.Tensor, rows: int, cols: int):
    """TMA descriptor of E4M3 [R, K] in [rows, cols] boxes."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    assert tma_ok(q), f"TMA needs 16-byte aligned rows, got row stride {q.stride(0)}"
    return TensorDescriptor(q, list(q.shape), [q.stride(0), 1], [rows, cols])


def upcast_dtype() -> tl.dtype:
    """bf16 for the upcast dot; float32 in the CPU interpreter, whose numpy dot would read bf16's raw storage."""
    return tl.float32 if interpreted() else tl.bfloat16
