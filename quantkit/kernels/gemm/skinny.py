"""Triton block-scaled FP8 GEMM for small M (decode): the weight streamed once at HBM bandwidth.

The function and operands of :mod:`.block_scaled` (A rows with 1x128 F32 or 1x32 E8M0 scales; W 128x128 F32 tiles or
1x32 E8M0), laid out for M <= 64, where reading the weight is the whole cost:

* swap-AB, GEMV-like: program (n, s, m) owns BLOCK_N weight rows x BLOCK_M tokens x the s-th slice of K, and promotes
  each K step's product into a float32 [BLOCK_N, BLOCK_M] accumulator times both scales;
* ``dot``: the product on the tensor core (BLOCK_M >= 16), else float32 ``tl.sum`` on CUDA cores (M <= 8);
* ``diag`` (per-32 scales on both sides): one fp8 dot per 128 columns on a block-diagonal activation tile gives the
  four 32-column products side by side, so the token tile starts at 4 rows;
* ``upcast`` (power-of-two scales): both tiles times their scales in bf16 (exact), one dot per 128 columns;
* split-K from the SM count (``waves`` programs per SM), capped so the float32 partials move no more bytes than the
  weight; the last program of a tile sums them in split order (deterministic) from a :class:`Workspace`.

A launch allocates only its output and keeps no per-call state: CUDA-graph safe after one warm-up call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..dispatch import sm_count
from .block_scaled import BLOCK_K, WORKSPACE, Side, Workspace, check_side, side_scale, split_plan, split_reduce, upcast_dtype
from ..triton_numerics import cdiv, e8m0_decode, e8m0_decode_lean, next_pow2, times_group_scales


@dataclass(frozen=True)
class SkinnyConfig:
    """One small-M launch.  ``block_m`` 0: the next power of two >= M; ``split_k`` 0: from ``waves`` programs
    per SM; ``chunk``: K columns per sub-step (smaller keeps the CUDA-core product in registers)."""

    block_n: int = 64
    block_m: int = 0
    split_k: int = 0
    waves: int = 4
    min_kb: int = 2  # K-blocks per split at least
    unsplit_kb: int = 0  # a K of at most this many blocks is not split
    dot: bool = True
    upcast: bool = False
    chunk: int = 128
    diag: bool = True
    num_warps: int = 4
    num_stages: int = 4

    def __str__(self) -> str:
        return self.name()

    def name(self) -> str:
        core = ("tc+up" if self.upcast else "tc") if self.dot else "cc"
        split = f"s{self.split_k}" if self.split_k else f"waves{self.waves}" + (f"kb{self.min_kb}" if self.min_kb != 2 else "")
        split += f"/whole{self.unsplit_kb}" if self.unsplit_kb and not self.split_k else ""
        dg = "" if self.diag else "/nodiag"
        return f"skinny {self.block_n}x{self.block_m or 'M'}/{core}/{split}/c{self.chunk}{dg}/w{self.num_warps}/st{self.num_stages}"


@triton.jit
def _upcast_tile(x, s_ptr, rows, row0, kb, n_kcols, stride_r, stride_k, RPS: tl.constexpr, KPS: tl.constexpr, E8M0: tl.constexpr,
                 R: tl.constexpr, BLOCK_K: tl.constexpr, UP_DTYPE: tl.constexpr):  # fmt: skip
    """E4M3 [R, BLOCK_K] times its power-of-two scales, in UP_DTYPE: exact, so one dot needs no promotion."""
    G: tl.constexpr = BLOCK_K // KPS
    cols = kb * G + tl.arange(0, G)
    if RPS % R == 0:  # one scale row for the tile: [G]
        s = tl.load(s_ptr + (row0 // RPS) * stride_r + cols * stride_k, mask=cols < n_kcols, other=0)
    else:  # [R, G]
        s = tl.load(s_ptr + (rows // RPS)[:, None] * stride_r + cols[None, :] * stride_k, mask=(cols < n_kcols)[None, :], other=0)
    if E8M0:
        s = e8m0_decode(s.to(tl.int32))
    if RPS % R != 0:
        xs = times_group_scales(x.to(tl.float32), s, KPS)
    elif G == 1:  # the tile's one scale, as a scalar
        xs = x.to(tl.float32) * tl.sum(s, axis=0)
    else:
        xs = times_group_scales(x.to(tl.float32), s[None, :], KPS)
    return xs.to(UP_DTYPE)


@triton.jit
def load_tile(ptrs, k_ok, rows_ok, ROWS_ON_1: tl.constexpr, MASK_K: tl.constexpr, PAD: tl.constexpr):
    """A [R, K] tile ([K, R] with ROWS_ON_1); columns past K (MASK_K) and, with PAD, rows not ``rows_ok`` load as
    zeros without being read."""
    if ROWS_ON_1:
        kmask = k_ok[:, None]
        rmask = rows_ok[None, :]
    else:
        kmask = k_ok[None, :]
        rmask = rows_ok[:, None]
    if MASK_K and PAD:
        x = tl.load(ptrs, mask=kmask & rmask, other=0.0)
    elif MASK_K:
        x = tl.load(ptrs, mask=kmask, other=0.0)
    elif PAD:
        x = tl.load(ptrs, mask=rmask, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _skinny_step(acc, w_ptr, ws_ptr, a_ptr, as_ptr, rows_w, rows_a, a_ok, n0, kb, K, WS_COLS, AS_COLS,
                 swn, swsn, swsk, sam, sasm, sask,
                 W_RPS: tl.constexpr, W_KPS: tl.constexpr, W_E8M0: tl.constexpr, A_KPS: tl.constexpr, A_E8M0: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr,
                 UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, PAD: tl.constexpr):  # fmt: skip
    """One BLOCK_K step, each SUB_K product promoted with both scales (UPCAST: one dot on scaled operands).  With
    PAD the token rows past M load as zeros unread: re-reading row M - 1 has every program ask for the same lines at once,
    up to 1.44x slower at M = 1."""
    W_UNIFORM: tl.constexpr = W_RPS % BLOCK_N == 0
    if UPCAST:
        k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rows_w[:, None] * swn + k[None, :]  # [BN, BLOCK_K]
        a_ptrs = a_ptr + rows_a[:, None] * sam + k[None, :]  # [BM, BLOCK_K]
        w = load_tile(w_ptrs, k < K, a_ok, False, MASKED, False)
        a = load_tile(a_ptrs, k < K, a_ok, False, MASKED, PAD)
        wb = _upcast_tile(w, ws_ptr, rows_w, n0, kb, WS_COLS, swsn, swsk, W_RPS, W_KPS, W_E8M0, BLOCK_N, BLOCK_K, UP_DTYPE)
        ab = _upcast_tile(a, as_ptr, rows_a, 0, kb, AS_COLS, sasm, sask, 1, A_KPS, A_E8M0, BLOCK_M, BLOCK_K, UP_DTYPE)
        acc = tl.dot(wb, ab.T, acc)
    else:
        offs_s = tl.arange(0, SUB_K)
        for j in tl.static_range(BLOCK_K // SUB_K):
            k = kb * BLOCK_K + j * SUB_K + offs_s
            w_ptrs = w_ptr + rows_w[:, None] * swn + k[None, :]  # [BN, SUB_K]
            if DOT:
                a_ptrs = a_ptr + k[:, None] + rows_a[None, :] * sam  # [SUB_K, BM]
            else:
                a_ptrs = a_ptr + rows_a[:, None] * sam + k[None, :]  # [BM, SUB_K]
            w = load_tile(w_ptrs, k < K, a_ok, False, MASKED, False)  # rows clamped to N - 1
            a = load_tile(a_ptrs, k < K, a_ok, DOT, MASKED, PAD)
            wcol = kb * (BLOCK_K // W_KPS) + (j * SUB_K) // W_KPS
            acol = kb * (BLOCK_K // A_KPS) + (j * SUB_K) // A_KPS
            ws = side_scale(ws_ptr, rows_w, n0, wcol, WS_COLS, swsn, swsk, W_RPS, BLOCK_N, W_E8M0)  # scalar or [BN]
            sa = tl.load(as_ptr + rows_a * sasm + acol * sask, mask=(rows_a * 0 + acol) < AS_COLS, other=0)  # [BM]
            if A_E8M0:
                sa = e8m0_decode(sa.to(tl.int32))
            if DOT:
                d = tl.dot(w, a)  # [BN, BM], fp8 tensor core
            else:
                d = tl.sum(w.to(tl.float32)[:, None, :] * a.to(tl.float32)[None, :, :], axis=2)  # [BN, BM]
            if W_UNIFORM:
                acc += d * (sa * ws)[None, :]
            else:
                acc += d * (ws[:, None] * sa[None, :])
    return acc


@triton.jit
def diag_act_tile(a_ptr, rows, ok, k, K, s_am, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
                  MASKED: tl.constexpr, PAD: tl.constexpr):  # fmt: skip
    """Block-diagonal E4M3 [BLOCK_K, G * BLOCK_M] (G = BLOCK_K / SUB_K): column g * BLOCK_M + m holds token
    ``rows[m]``'s sub-block g, zeros elsewhere (masked, unread)."""
    G: tl.constexpr = BLOCK_K // SUB_K
    c = tl.arange(0, G * BLOCK_M)
    rows_c = tl.reshape(tl.broadcast_to(rows[None, :], (G, BLOCK_M)), (G * BLOCK_M,))
    mask = (tl.arange(0, BLOCK_K) // SUB_K)[:, None] == (c // BLOCK_M)[None, :]
    if MASKED:
        mask = mask & (k < K)[:, None]
    if PAD:
        ok_c = tl.reshape(tl.broadcast_to(ok[None, :], (G, BLOCK_M)), (G * BLOCK_M,))
        mask = mask & ok_c[None, :]
    return tl.load(a_ptr + k[:, None] + rows_c[None, :] * s_am, mask=mask, other=0.0)


@triton.jit
def diag_promote(acc, d, ws, sa):
    """acc [R, BM] += sum over g of d[:, g * BM + m] * ws[:, g] * sa[g, m] (d [R, G * BM], the side-by-side
    products); the sum over g stays within each thread."""
    R: tl.constexpr = acc.shape[0]
    BM: tl.constexpr = acc.shape[1]
    G: tl.constexpr = ws.shape[1]
    return acc + tl.sum(tl.reshape(d, (R, G, BM)) * (ws[:, :, None] * sa[None, :, :]), axis=1)


@triton.jit
def _skinny_step_diag(acc, w_ptr, ws_ptr, a_ptr, as_ptr, rows_w, rows_a, a_ok, kb, K, WS_COLS, AS_COLS,
                      swn, swsn, swsk, sam, sasm, sask, W_E8M0: tl.constexpr, A_E8M0: tl.constexpr, W_WORDS: tl.constexpr, A_WORDS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, MASKED: tl.constexpr, PAD: tl.constexpr):  # fmt: skip
    """One BLOCK_K step with per-SUB_K scales on both sides in one tensor-core dot on the block-diagonal
    activation tile: one dot and one wait instead of G, and a token tile of 16 / G rows, so at M <= 4 a quarter of the
    promotion work; the tensor core does G times the product it needs, and is idle at these M anyway."""
    G: tl.constexpr = BLOCK_K // SUB_K
    k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    w = load_tile(w_ptr + rows_w[:, None] * swn + k[None, :], k < K, a_ok, False, MASKED, False)  # [BN, BLOCK_K]
    a = diag_act_tile(a_ptr, rows_a, a_ok, k, K, sam, BLOCK_M, BLOCK_K, SUB_K, MASKED, PAD)  # [BLOCK_K, G * BM]
    gi = tl.arange(0, G)
    gcol = kb * G + gi
    if W_WORDS:  # a row's 4 byte scales of this block as one aligned int32
        word = tl.load(ws_ptr.to(tl.pointer_type(tl.int32)) + rows_w * (swsn // 4) + kb)  # [BN]
        ws = (word[:, None] >> (8 * gi)[None, :]) & 0xFF  # [BN, G]
    else:
        ws = tl.load(ws_ptr + rows_w[:, None] * swsn + gcol[None, :] * swsk, mask=(gcol < WS_COLS)[None, :], other=127)  # [BN, G]
    if A_WORDS:
        word = tl.load(as_ptr.to(tl.pointer_type(tl.int32)) + rows_a * (sasm // 4) + kb)  # [BM]
        sa = (word[None, :] >> (8 * gi)[:, None]) & 0xFF  # [G, BM]
    else:
        sa = tl.load(as_ptr + rows_a[None, :] * sasm + gcol[:, None] * sask, mask=(gcol < AS_COLS)[:, None], other=127)  # [G, BM]
    if W_E8M0:
        ws = e8m0_decode_lean(ws)
    if A_E8M0:
        sa = e8m0_decode_lean(sa)
    return diag_promote(acc, tl.dot(w, a), ws, sa)


@triton.jit
def _kernel_step(acc, w_ptr, ws_ptr, a_ptr, as_ptr, rows_w, rows_a, a_ok, n0, kb, K, WS_COLS, AS_COLS, swn, swsn, swsk, sam, sasm, sask,
                 W_RPS: tl.constexpr, W_KPS: tl.constexpr, W_E8M0: tl.constexpr, A_KPS: tl.constexpr, A_E8M0: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, DOT: tl.constexpr,
                 MASKED: tl.constexpr, UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr, PAD: tl.constexpr,
                 DIAG: tl.constexpr, W_WORDS: tl.constexpr, A_WORDS: tl.constexpr):  # fmt: skip
    """One K-block: the block-diagonal step (DIAG) or the promoted / upcast one."""
    if DIAG:
        return _skinny_step_diag(acc, w_ptr, ws_ptr, a_ptr, as_ptr, rows_w, rows_a, a_ok, kb, K, WS_COLS, AS_COLS,
                                 swn, swsn, swsk, sam, sasm, sask, W_E8M0, A_E8M0, W_WORDS, A_WORDS, BLOCK_M, BLOCK_K, SUB_K, MASKED, PAD)  # fmt: skip
    return _skinny_step(acc, w_ptr, ws_ptr, a_ptr, as_ptr, rows_w, rows_a, a_ok, n0, kb, K, WS_COLS, AS_COLS,
                        swn, swsn, swsk, sam, sasm, sask, W_RPS, W_KPS, W_E8M0, A_KPS, A_E8M0,
                        BLOCK_N, BLOCK_K, SUB_K, DOT, MASKED, UPCAST, UP_DTYPE, BLOCK_M, PAD)  # fmt: skip


@triton.jit(do_not_specialize=["M", "N", "WS_COLS", "AS_COLS", "swsn", "swsk", "sasm", "sask", "kb_per_split"])
def _skinny_kernel(
    w_ptr, ws_ptr, a_ptr, as_ptr, c_ptr, bias_ptr, part_ptr, count_ptr,
    M, N, K, WS_COLS, AS_COLS, kb_per_split,
    swn, swsn, swsk, sam, sasm, sask, scm,
    W_RPS: tl.constexpr, W_KPS: tl.constexpr, W_E8M0: tl.constexpr, A_KPS: tl.constexpr, A_E8M0: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, HAS_SPLIT: tl.constexpr, STAGES: tl.constexpr,
    UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr, PAD: tl.constexpr, DIAG: tl.constexpr,
    W_WORDS: tl.constexpr, A_WORDS: tl.constexpr,
):  # fmt: skip
    """out[M, N] = A[M, K] @ W[N, K].T; grid (n tiles, splits, m tiles)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_w = tl.minimum(offs_n, N - 1)  # never stored
    rows_a = tl.minimum(offs_m, M - 1)
    a_ok = offs_m < M  # with PAD only: masking full tiles costs up to 1.4x at M = 64
    n_full = K // BLOCK_K
    kb_lo = split * kb_per_split
    kb_hi = tl.minimum(kb_lo + kb_per_split, tl.cdiv(K, BLOCK_K))
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in tl.range(kb_lo, tl.minimum(kb_hi, n_full), num_stages=STAGES):
        acc = _kernel_step(acc, w_ptr, ws_ptr, a_ptr, as_ptr, rows_w, rows_a, a_ok, n0, kb, K, WS_COLS, AS_COLS, swn, swsn, swsk, sam, sasm, sask,
                           W_RPS, W_KPS, W_E8M0, A_KPS, A_E8M0, BLOCK_N, BLOCK_M, BLOCK_K, SUB_K, DOT, False, UPCAST, UP_DTYPE, PAD,
                           DIAG, W_WORDS, A_WORDS)  # fmt: skip
    if (kb_hi > n_full) & (kb_lo <= n_full):  # this split holds the partial last block
        acc = _kernel_step(acc, w_ptr, ws_ptr, a_ptr, as_ptr, rows_w, rows_a, a_ok, n0, n_full, K, WS_COLS, AS_COLS, swn, swsn, swsk, sam, sasm, sask,
                           W_RPS, W_KPS, W_E8M0, A_KPS, A_E8M0, BLOCK_N, BLOCK_M, BLOCK_K, SUB_K, DOT, True, UPCAST, UP_DTYPE, PAD,
                           DIAG, W_WORDS, A_WORDS)  # fmt: skip
    if HAS_SPLIT:
        tile = pid_m * tl.num_programs(0) + pid_n
        n_tiles = tl.num_programs(0) * tl.num_programs(2)
        last, acc = split_reduce(acc, part_ptr, count_ptr, tile, n_tiles, split, tl.num_programs(1), BLOCK_N, BLOCK_M)
    else:
        last = True
    if last:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
        mask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
        tl.store(c_ptr + offs_m[None, :] * scm + offs_n[:, None], acc.to(c_ptr.dtype.element_ty), mask=mask)


MAX_AUTO_BLOCK_M = 128  # larger M: several token tiles, each reading the weight


def block_m_for(m: int, cfg: SkinnyConfig, diag_groups: int = 1) -> int:
    """Token tile: the config's, else the next power of two >= M up to 128; a tensor-core dot needs 16 columns,
    which the block-diagonal step (``diag_groups`` side by side) reaches from 16 / G rows."""
    if cfg.block_m:
        return cfg.block_m
    bm = min(next_pow2(max(m, 1)), MAX_AUTO_BLOCK_M)
    return max(bm, 16 // diag_groups) if cfg.dot else bm


def skinny_split(cfg: SkinnyConfig, tiles: int, k: int, block_m: int, sms: int) -> tuple[int, int]:
    """(splits, K-blocks per split): ``waves`` programs per SM, >= ``min_kb`` blocks each, partials no larger
    than the weight; no split where K is at most ``unsplit_kb`` blocks (a split-K reduction costs about 2 us a call,
    more than splitting so short a K saves)."""
    n_kb = cdiv(k, BLOCK_K)
    if cfg.split_k:
        return split_plan(cfg.split_k, n_kb)
    if n_kb <= cfg.unsplit_kb:
        return 1, n_kb
    want = min(cdiv(cfg.waves * sms, tiles), max(1, k // (8 * block_m)), max(1, n_kb // cfg.min_kb))
    return split_plan(want, n_kb)


def scale_words_ok(side: Side) -> bool:
    """U8 scales readable four bytes at a time: one per 32 columns, K % 128 == 0, rows 4-byte aligned."""
    s = side.s
    return s.dtype == torch.uint8 and side.kps == 32 and s.shape[1] % 4 == 0 and s.stride(1) == 1 and s.stride(0) % 4 == 0 and s.data_ptr() % 4 == 0


def skinny_mm(a: Side, w: Side, bias: torch.Tensor | None, out_dtype: torch.dtype, cfg: SkinnyConfig, workspace: Workspace | None = None) -> torch.Tensor:
    """[M, K] tokens x [N, K] weight -> out_dtype [M, N]."""
    m, k = a.q.shape
    n = w.q.shape[0]
    check_side(a, "activation", k)
    check_side(w, "weight", k)
    assert a.rps == 1, f"activation scales must be per row, got {a.rps} rows per scale"
    assert w.rps == 1 or w.rps % cfg.block_n == 0, f"{cfg.name()}: BLOCK_N must divide the weight's {w.rps}-row scale tiles"
    assert bias is None or tuple(bias.shape) == (n,), f"bias must be [{n}], got {None if bias is None else tuple(bias.shape)}"
    sub_k = min(w.kps, a.kps, cfg.chunk)
    diag = cfg.diag and cfg.dot and not cfg.upcast and w.rps == 1 and w.kps == a.kps == sub_k < BLOCK_K
    groups = BLOCK_K // sub_k if diag else 1
    bm = block_m_for(m, cfg, groups)
    assert not cfg.upcast or (cfg.dot and all(t.pow2 or t.s.dtype == torch.uint8 for t in (a, w))), f"{cfg.name()}: upcast needs the dot and power-of-two scales"
    assert not cfg.dot or bm * groups >= 16, f"{cfg.name()}: the tensor-core dot needs BLOCK_M >= {16 // groups}"
    out = torch.empty((m, n), dtype=out_dtype, device=a.q.device)  # [M, N]
    if m == 0 or n == 0:
        return out
    ws = workspace or WORKSPACE
    n_tiles, m_tiles = cdiv(n, cfg.block_n), cdiv(m, bm)
    split, per = skinny_split(cfg, n_tiles * m_tiles, k, bm, sm_count(out.device))
    tiles = n_tiles * m_tiles
    words = [diag and scale_words_ok(t) for t in (w, a)]
    part, count = (ws.partials(split * tiles * cfg.block_n * bm, out.device), ws.counters(tiles, out.device)) if split > 1 else (out, out)
    _skinny_kernel[(n_tiles, split, m_tiles)](
        w.q, w.s, a.q, a.s, out, bias if bias is not None else out, part, count,
        m, n, k, w.s.shape[1], a.s.shape[1], per,
        w.q.stride(0), w.s.stride(0), w.s.stride(1), a.q.stride(0), a.s.stride(0), a.s.stride(1), out.stride(0),
        W_RPS=w.rps, W_KPS=w.kps, W_E8M0=w.s.dtype == torch.uint8, A_KPS=a.kps, A_E8M0=a.s.dtype == torch.uint8,
        HAS_BIAS=bias is not None, DOT=cfg.dot, BLOCK_N=cfg.block_n, BLOCK_M=bm,
        BLOCK_K=BLOCK_K, SUB_K=sub_k, HAS_SPLIT=split > 1, STAGES=cfg.num_stages,
        UPCAST=cfg.upcast, UP_DTYPE=upcast_dtype(), PAD=m % bm != 0, DIAG=diag, W_WORDS=words[0], A_WORDS=words[1],
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
