"""Gluon kernels of :mod:`.wgmma` (sm_90; imported on first use): the FP8-block GEMM :func:`fp8_block_gemm_ws` and the
pipeline pieces the fused MoE's grouped GEMMs share.

One program per SM loops over 128 x BN output tiles in grouped order, warp-specialised: a TMA warp streams activation and
weight tiles into a ring of STAGES shared-memory stages (``ready`` / ``empty`` mbarriers); two 64-row consumer
warpgroups issue ``wgmma`` per 128-deep K block into a fresh float32 tile and promote it into their accumulator times the
block's scales, then store their half tile (TMA store, or masked stores).  SPLIT_K cuts a tile's K blocks into runs
reduced in run order by the last to arrive.

The promotion of block k runs on the CUDA cores while the tensor core works on block k + 1 (groups of UNROLL, each
``wgmma_wait(1)`` retiring the older).  Nothing stays in flight across a loop's back edge: a loop-carried ``wgmma``
result makes ptxas serialise every ``wgmma`` (warning C7514); the waits take the accumulator as a dependency so ptxas
cannot sink the promotion past the next wait.  Scales are loaded one group ahead.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

BK_SCALE: gl.constexpr = gl.constexpr(128)  # columns (and weight rows) per scale
# the names of Triton 3.6 and of later releases
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _tile(t, n_m, n_n, GROUP: gl.constexpr):
    """Grouped order: GROUP row-tiles share a column tile while it is in L2."""
    width = GROUP * n_n
    first = (t // width) * GROUP
    size = gl.minimum(n_m - first, GROUP)
    return first + (t % width) % size, (t % width) // size


@gluon.jit
def _column(x, j: gl.constexpr, kcol):
    """Column j of a [R, UNROLL] register tile, as an [R] vector."""
    return gl.sum(gl.where(kcol[None, :] == j, x, 0.0), axis=1)


@gluon.jit
def _issue(a_smem, w_smem, ready, c, zero, HALF: gl.constexpr, HM: gl.constexpr, STAGES: gl.constexpr, HALVES: gl.constexpr,
           SPLIT_N: gl.constexpr):  # fmt: skip
    """Wait for the c-th stage, then start this warpgroup's async wgmma(s) on it: its HM rows (SPLIT_N: all rows
    against its own 128 of 256 weight rows), or (HALVES) one per 64-row gate / up piece."""
    s = c % STAGES
    mbarrier.wait(ready.index(s), (c // STAGES) & 1)
    if SPLIT_N:
        a = a_smem.index(s)
        wb: gl.constexpr = HALF * 128
    else:
        a = a_smem.index(s).slice(HALF * HM, HM)
        wb: gl.constexpr = 0
    if HALVES:
        d_g = warpgroup_mma(a, w_smem.index(s).slice(wb, 64).permute((1, 0)), zero, use_acc=False, is_async=True)
        d_u = warpgroup_mma(a, w_smem.index(s).slice(wb + 64, 64).permute((1, 0)), zero, use_acc=False, is_async=True)
        return d_g, d_u
    else:
        WN: gl.constexpr = zero.shape[1]
        d = warpgroup_mma(a, w_smem.index(s).slice(wb, WN).permute((1, 0)), zero, use_acc=False, is_async=True)
        return d, d


@gluon.jit
def _k_loop(a_smem, w_smem, ready, empty, acc_g, acc_u, zero, c, n_k, kmax, kcol, a_sc, sask, wg_sc, wu_sc, swsk,
            HALF: gl.constexpr, HM: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr, HALVES: gl.constexpr,
            SPLIT_N: gl.constexpr):  # fmt: skip
    """One tile's K blocks from ring position c, each promoted times its activation-row scales (a_sc + k * sask) and
    weight scale (wg_sc + k * swsk; HALVES: wu_sc into acc_u), overlapping the next block's wgmma.  (acc_g, acc_u, c)."""
    NW: gl.constexpr = 2 if HALVES else 1
    n_main = n_k - n_k % UNROLL
    kn = gl.minimum(kcol, kmax)
    sa = gl.load(a_sc[:, None] + kn[None, :] * sask)
    scg = sa * gl.load(wg_sc + kn * swsk)[None, :]
    if HALVES:
        scu = sa * gl.load(wu_sc + kn * swsk)[None, :]
    for k0 in range(0, n_main, UNROLL):
        kn = gl.minimum(k0 + UNROLL + kcol, kmax)  # the next group's scales
        sa_n = gl.load(a_sc[:, None] + kn[None, :] * sask)
        swg_n = gl.load(wg_sc + kn * swsk)
        if HALVES:
            swu_n = gl.load(wu_sc + kn * swsk)
        dg_p, du_p = _issue(a_smem, w_smem, ready, c, zero, HALF, HM, STAGES, HALVES, SPLIT_N)
        for u in gl.static_range(1, UNROLL):
            dg_c, du_c = _issue(a_smem, w_smem, ready, c + u, zero, HALF, HM, STAGES, HALVES, SPLIT_N)
            if HALVES:
                rg, ru, acc_g, acc_u = warpgroup_mma_wait(num_outstanding=NW, deps=(dg_p, du_p, acc_g, acc_u))
                acc_u += ru * _column(scu, u - 1, kcol)[:, None]
            else:
                rg, acc_g = warpgroup_mma_wait(num_outstanding=NW, deps=(dg_p, acc_g))
            mbarrier.arrive(empty.index((c + u - 1) % STAGES), count=1)
            acc_g += rg * _column(scg, u - 1, kcol)[:, None]
            dg_p = dg_c
            du_p = du_c
        if HALVES:
            rg, ru, acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(dg_p, du_p, acc_g, acc_u))
            acc_u += ru * _column(scu, UNROLL - 1, kcol)[:, None]
        else:
            rg, acc_g = warpgroup_mma_wait(num_outstanding=0, deps=(dg_p, acc_g))
        mbarrier.arrive(empty.index((c + UNROLL - 1) % STAGES), count=1)
        acc_g += rg * _column(scg, UNROLL - 1, kcol)[:, None]
        scg = sa_n * swg_n[None, :]
        if HALVES:
            scu = sa_n * swu_n[None, :]
        c += UNROLL
    for k in range(n_main, n_k):
        dg_p, du_p = _issue(a_smem, w_smem, ready, c, zero, HALF, HM, STAGES, HALVES, SPLIT_N)
        sa_k = gl.load(a_sc + k * sask)
        scg_k = sa_k * gl.load(wg_sc + k * swsk)
        if HALVES:
            scu_k = sa_k * gl.load(wu_sc + k * swsk)
            rg, ru = warpgroup_mma_wait(num_outstanding=0, deps=(dg_p, du_p))
            acc_u += ru * scu_k[:, None]
        else:
            rg = warpgroup_mma_wait(num_outstanding=0, deps=(dg_p,))
        mbarrier.arrive(empty.index(c % STAGES), count=1)
        acc_g += rg * scg_k[:, None]
        c += 1
    return acc_g, acc_u, c


@gluon.jit
def _unit(t, n_m, n_n, n_k, SPLITS, KPER, GROUP: gl.constexpr):
    """Work unit t: (tile, pm, pn, first K block, K blocks); consecutive units are one tile's splits."""
    tile = t // SPLITS
    pm, pn = _tile(tile, n_m, n_n, GROUP)
    kb0 = (t % SPLITS) * KPER
    return tile, pm, pn, kb0, gl.minimum(n_k - kb0, KPER)


@gluon.jit
def _loader(
    a_desc,
    w_desc,
    a_smem,
    w_smem,
    ready,
    empty,
    M,
    N,
    n_k,
    SPLITS,
    KPER,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    GROUP: gl.constexpr,
):
    n_m = gl.cdiv(M, BM)
    n_n = gl.cdiv(N, BN)
    nbytes: gl.constexpr = (BM + BN) * BK
    c = 0
    for t in range(gl.program_id(0), n_m * n_n * SPLITS, gl.num_programs(0)):
        _, pm, pn, kb0, nb = _unit(t, n_m, n_n, n_k, SPLITS, KPER, GROUP)
        for k in range(kb0, kb0 + nb):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
            mbarrier.expect(ready.index(s), nbytes)
            _tma_load(a_desc, [pm * BM, k * BK], ready.index(s), a_smem.index(s))
            _tma_load(w_desc, [pn * BN, k * BK], ready.index(s), w_smem.index(s))
            c += 1


@gluon.jit
def _split_reduce(acc, part_ptr, count_ptr, slot, n_slots, split, SPLITS):
    """Deterministic split-K as :func:`.block_scaled.split_reduce_pair`, per half tile: (is_last, sum)."""
    lay: gl.constexpr = acc.type.layout
    HM: gl.constexpr = acc.shape[0]
    BN: gl.constexpr = acc.shape[1]
    loc = gl.arange(0, HM, layout=gl.SliceLayout(1, lay))[:, None] * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, lay))[None, :]
    base = part_ptr + slot.to(gl.int64) * (HM * BN)
    stride = n_slots.to(gl.int64) * (HM * BN)
    gl.store(base + split * stride + loc, acc)
    _barrier()  # every partial is written before the counter is released
    arrived = gl.atomic_add(count_ptr + slot, 1, sem="acq_rel")
    last = arrived == SPLITS - 1
    total = gl.zeros([HM, BN], gl.float32, lay)
    if last:
        for s in range(0, SPLITS):
            total += gl.load(base + s * stride + loc, cache_modifier=".cg")
        gl.store(count_ptr + slot, 0)
    return last, total


@gluon.jit
def _store_tile(acc, bias_ptr, c_ptr, c_desc, c_smem, M, N, scm, row0, pn, HM: gl.constexpr, BN: gl.constexpr, HAS_BIAS: gl.constexpr,
                TMA_STORE: gl.constexpr):  # fmt: skip
    """Bias, then one warpgroup's [HM, BN] half tile out: TMA store through shared memory, or masked stores."""
    lay: gl.constexpr = acc.type.layout
    cols = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, lay))
    if HAS_BIAS:
        acc += gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
    if TMA_STORE:
        tma.store_wait(0)  # the previous tile has left shared memory
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        _tma_store(c_desc, [row0, pn * BN], c_smem)
    else:
        offs_m = row0 + gl.arange(0, HM, layout=gl.SliceLayout(1, lay))
        mask = (offs_m < M)[:, None] & (cols < N)[None, :]
        gl.store(c_ptr + offs_m[:, None] * scm + cols[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _consumer(
    a_smem,
    w_smem,
    ready,
    empty,
    as_ptr,
    ws_ptr,
    bias_ptr,
    c_ptr,
    c_desc,
    c_smem,
    part_ptr,
    count_ptr,
    M,
    N,
    sasm,
    sask,
    swsn,
    swsk,
    scm,
    n_k,
    SPLITS,
    KPER,
    HALF: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    STAGES: gl.constexpr,
    UNROLL: gl.constexpr,
    GROUP: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    TMA_STORE: gl.constexpr,
    SPLIT_K: gl.constexpr,
):
    HM: gl.constexpr = BM // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    n_m = gl.cdiv(M, BM)
    n_n = gl.cdiv(N, BN)
    zero = gl.zeros([HM, BN], gl.float32, mma)
    kcol = gl.arange(0, UNROLL, layout=col_l)
    c = 0
    for t in range(gl.program_id(0), n_m * n_n * SPLITS, gl.num_programs(0)):
        tile, pm, pn, kb0, nb = _unit(t, n_m, n_n, n_k, SPLITS, KPER, GROUP)
        row0 = pm * BM + HALF * HM
        a_sc = as_ptr + gl.minimum(row0 + gl.arange(0, HM, layout=row_l), M - 1) * sasm + kb0 * sask
        w_sc = ws_ptr + ((pn * BN) // BK_SCALE) * swsn + kb0 * swsk  # BN divides 128
        acc = gl.zeros([HM, BN], gl.float32, mma)
        acc, _, c = _k_loop(a_smem, w_smem, ready, empty, acc, acc, zero, c, nb, nb - 1, kcol, a_sc, sask, w_sc, w_sc, swsk,
                            HALF, HM, STAGES, UNROLL, False, False)  # fmt: skip
        if SPLIT_K:
            if row0 < M:  # a half tile past M has nothing to add
                last, total = _split_reduce(acc, part_ptr, count_ptr, tile * 2 + HALF, n_m * n_n * 2, t % SPLITS, SPLITS)
                if last:
                    _store_tile(total, bias_ptr, c_ptr, c_desc, c_smem, M, N, scm, row0, pn, HM, BN, HAS_BIAS, TMA_STORE)
        else:
            _store_tile(acc, bias_ptr, c_ptr, c_desc, c_smem, M, N, scm, row0, pn, HM, BN, HAS_BIAS, TMA_STORE)
    if TMA_STORE:
        tma.store_wait(0)


@gluon.jit
def fp8_block_gemm_ws(
    a_desc,
    w_desc,
    c_desc,
    as_ptr,
    ws_ptr,
    bias_ptr,
    c_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    sasm,
    sask,
    swsn,
    swsk,
    scm,
    SPLITS,
    KPER,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    STAGES: gl.constexpr,
    UNROLL: gl.constexpr,
    GROUP: gl.constexpr,
    REGS: gl.constexpr,
    LOADER_REGS: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    TMA_STORE: gl.constexpr,
    SPLIT_K: gl.constexpr,
):
    """SPLIT_K: SPLITS runs of KPER K blocks per tile (none empty), reduced through ``part_ptr`` / ``count_ptr``;
    else SPLITS is 1."""
    a_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK], a_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warpgroup
    if TMA_STORE:
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [2, BM // 2, BN], c_desc.layout)
        c0 = c_smem.index(0)
        c1 = c_smem.index(1)
    else:  # c_desc is None: masked stores, no staging
        c0 = a_smem
        c1 = a_smem
    n_k = gl.cdiv(K, BK)
    gl.warp_specialize([
        (_consumer, (a_smem, w_smem, ready, empty, as_ptr, ws_ptr, bias_ptr, c_ptr, c_desc, c0, part_ptr, count_ptr, M, N, sasm,
                     sask, swsn, swsk, scm, n_k, SPLITS, KPER, 0, BM, BN, STAGES, UNROLL, GROUP, HAS_BIAS, TMA_STORE, SPLIT_K)),
        (_consumer, (a_smem, w_smem, ready, empty, as_ptr, ws_ptr, bias_ptr, c_ptr, c_desc, c1, part_ptr, count_ptr, M, N, sasm,
                     sask, swsn, swsk, scm, n_k, SPLITS, KPER, 1, BM, BN, STAGES, UNROLL, GROUP, HAS_BIAS, TMA_STORE, SPLIT_K)),
        (_loader, (a_desc, w_desc, a_smem, w_smem, ready, empty, M, N, n_k, SPLITS, KPER, BM, BN, BK, STAGES, GROUP)),
    ], [4, 1], [REGS, LOADER_REGS])  # fmt: skip
