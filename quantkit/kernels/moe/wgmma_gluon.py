"""Gluon kernel of the ``triton.sorted_wgmma`` leaf (sm_90; imported on first use): :mod:`..gemm.wgmma_gluon`'s
pipeline over a grouped GEMM, each BM-row block one expert.  GEMM 1 pairs gate and up in the epilogue (interleaved
columns, or concatenated halves: HALVES); GEMM 2 scatters row r to slot sorted_ids[r].
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ..gemm.wgmma_gluon import BK_SCALE, _k_loop, _tile, _tma_load


@gluon.jit
def _bf16(x, ROUND: gl.constexpr):
    """float32 -> nearest bfloat16 -> float32 where ROUND."""
    if ROUND:
        return x.to(gl.bfloat16).to(gl.float32)
    else:
        return x


@gluon.jit
def _moe_act(g, u, ACT: gl.constexpr, alpha, limit, ROUND: gl.constexpr):
    """:func:`.common.moe_activation`."""
    if ACT == 0:
        s = _bf16(gl.div_rn(g, 1.0 + gl.exp(-g)), ROUND)
        return _bf16(s * u, ROUND)
    else:
        g = gl.minimum(g, limit)
        u = gl.minimum(gl.maximum(u, -limit), limit)
        sig = _bf16(gl.div_rn(gl.full_like(g, 1.0), 1.0 + gl.exp(-_bf16(g * alpha, ROUND))), ROUND)
        return _bf16(_bf16(u + 1.0, ROUND) * _bf16(g * sig, ROUND), ROUND)


@gluon.jit
def _moe_loader(a_desc, w_desc, a_smem, w_smem, ready, empty, expert_ptr, npad_ptr, CAP, N_OUT, N_W, up_off, n_k,
                BM: gl.constexpr, BN_WG: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                HALVES: gl.constexpr, SPLIT_N: gl.constexpr):  # fmt: skip
    """Per stage: [BM, BK] activation rows and 128 (SPLIT_N: 256) weight rows; HALVES: 64-row gate and up pieces."""
    NWG: gl.constexpr = 2 if SPLIT_N else 1  # warpgroups with their own weight rows
    BN_TILE: gl.constexpr = BN_WG * NWG
    n_m = gl.cdiv(CAP, BM)
    n_n = gl.cdiv(N_OUT, BN_TILE)
    npad = gl.load(npad_ptr)
    nbytes: gl.constexpr = (BM + 128 * NWG) * BK
    c = 0
    for t in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pm, pn = _tile(t, n_m, n_n, GROUP)
        if pm * BM < npad:
            wrow = gl.load(expert_ptr + pm) * N_W
            for k in range(n_k):
                s = c % STAGES
                mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                _tma_load(a_desc, [pm * BM, k * BK], ready.index(s), a_smem.index(s))
                if HALVES:  # gate rows n0.., up rows up_off + n0.. of each warpgroup's 64 columns
                    for h in gl.static_range(NWG):
                        n0 = pn * BN_TILE + h * BN_WG
                        _tma_load(w_desc, [wrow + n0, k * BK], ready.index(s), w_smem.index(s).slice(h * 128, 64))
                        _tma_load(w_desc, [wrow + up_off + n0, k * BK], ready.index(s), w_smem.index(s).slice(h * 128 + 64, 64))
                else:  # 128 weight rows per warpgroup: 2 x 64 interleaved gate/up columns, or 128 output columns
                    _tma_load(w_desc, [wrow + pn * 128 * NWG, k * BK], ready.index(s), w_smem.index(s))
                c += 1


@gluon.jit
def _moe_consumer(a_smem, w_smem, ready, empty, as_ptr, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr, n_slots,
                  CAP, N_OUT, N_W, K, up_off, alpha, limit, sasm, swse, swsn, swsk, sbe, som, n_k,
                  HALF: gl.constexpr, BM: gl.constexpr, BN_WG: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr,
                  GROUP: gl.constexpr, GATED: gl.constexpr, HALVES: gl.constexpr, HAS_BIAS: gl.constexpr, ROUND: gl.constexpr,
                  ACT: gl.constexpr, SPLIT_N: gl.constexpr):  # fmt: skip
    HM: gl.constexpr = BM if SPLIT_N else BM // 2  # rows of this warpgroup
    BN_TILE: gl.constexpr = BN_WG * (2 if SPLIT_N else 1)
    WN: gl.constexpr = 64 if HALVES else 128  # weight rows per wgmma
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, WN, 32])
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    n_m = gl.cdiv(CAP, BM)
    n_n = gl.cdiv(N_OUT, BN_TILE)
    npad = gl.load(npad_ptr)
    zero = gl.zeros([HM, WN], gl.float32, mma)
    kcol = gl.arange(0, UNROLL, layout=col_l)
    kmax = gl.cdiv(K, BK_SCALE) - 1
    c = 0
    for t in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pm, pn = _tile(t, n_m, n_n, GROUP)
        if pm * BM < npad:
            e = gl.load(expert_ptr + pm).to(gl.int64)
            if SPLIT_N:
                row0 = pm * BM
                col0 = pn * BN_TILE + HALF * BN_WG  # this warpgroup's first output column
            else:
                row0 = pm * BM + HALF * HM
                col0 = pn * BN_TILE
            a_sc = as_ptr + (row0 + gl.arange(0, HM, layout=row_l)) * sasm
            # scale rows clamped to the expert's last: a SPLIT_N tile's second warpgroup may lie past N_OUT
            last = (N_W - 1) // BK_SCALE
            if HALVES:
                wg_sc = ws_ptr + e * swse + gl.minimum(col0 // BK_SCALE, last) * swsn
                wu_sc = ws_ptr + e * swse + gl.minimum((up_off + col0) // BK_SCALE, last) * swsn
            else:  # 128 weight rows from row col0 (x 2: interleaved gate/up), under one scale
                wg_sc = ws_ptr + e * swse + gl.minimum((col0 * (2 if GATED else 1)) // BK_SCALE, last) * swsn
                wu_sc = wg_sc
            acc_g = gl.zeros([HM, WN], gl.float32, mma)
            acc_u = gl.zeros([HM, WN], gl.float32, mma)
            acc_g, acc_u, c = _k_loop(a_smem, w_smem, ready, empty, acc_g, acc_u, zero, c, n_k, kmax, kcol, a_sc, 1, wg_sc, wu_sc, swsk,
                                      HALF, HM, STAGES, UNROLL, HALVES, SPLIT_N)  # fmt: skip
            _moe_epilogue(acc_g, acc_u, bias_ptr, out_ptr, sorted_ptr, e, row0, col0, n_slots, CAP, N_OUT, up_off, alpha, limit,
                          sbe, som, HM, BN_WG, GATED, HALVES, HAS_BIAS, ROUND, ACT)  # fmt: skip


@gluon.jit
def _moe_epilogue(acc_g, acc_u, bias_ptr, out_ptr, sorted_ptr, e, row0, col0, n_slots, CAP, N_OUT, up_off, alpha, limit, sbe, som,
                  HM: gl.constexpr, BN_OUT: gl.constexpr, GATED: gl.constexpr, HALVES: gl.constexpr, HAS_BIAS: gl.constexpr,
                  ROUND: gl.constexpr, ACT: gl.constexpr):  # fmt: skip
    """Bias, rounding, activation (GATED), then the store: sorted rows (GATED) or each row to its slot."""
    if GATED:
        if HALVES:
            g = acc_g
            u = acc_u
        else:  # interleaved gate/up: accumulator columns 2j, 2j + 1
            g, u = gl.split(gl.reshape(acc_g, [HM, BN_OUT, 2]))
    else:
        g = acc_g
        u = acc_g
    lay: gl.constexpr = g.type.layout
    cols = col0 + gl.arange(0, BN_OUT, layout=gl.SliceLayout(0, lay))
    rows = row0 + gl.arange(0, HM, layout=gl.SliceLayout(1, lay))
    col_ok = cols < N_OUT
    bias_e = bias_ptr + e * sbe
    if GATED:
        if HALVES:
            row_g = cols
            row_u = cols + up_off
        else:
            row_g = 2 * cols
            row_u = row_g + 1
        if HAS_BIAS:
            g += gl.load(bias_e + row_g, mask=col_ok, other=0.0).to(gl.float32)[None, :]
            u += gl.load(bias_e + row_u, mask=col_ok, other=0.0).to(gl.float32)[None, :]
        h = _moe_act(_bf16(g, ROUND), _bf16(u, ROUND), ACT, alpha, limit, ROUND)
        ok = rows < CAP
        out_rows = rows.to(gl.int64)
    else:
        if HAS_BIAS:
            g += gl.load(bias_e + cols, mask=col_ok, other=0.0).to(gl.float32)[None, :]
        h = _bf16(g, ROUND)
        slot = gl.load(sorted_ptr + rows)
        ok = slot < n_slots
        out_rows = gl.where(ok, slot, 0).to(gl.int64)
    mask = ok[:, None] & col_ok[None, :]
    gl.store(out_ptr + out_rows[:, None] * som + cols[None, :], h.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def moe_gemm_ws(a_desc, w_desc, as_ptr, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr, n_slots, CAP, N_OUT, N_W, K,
                up_off, alpha, limit, sasm, swse, swsn, swsk, sbe, som,
                BM: gl.constexpr, BN_WG: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr,
                GROUP: gl.constexpr, REGS: gl.constexpr, LOADER_REGS: gl.constexpr, GATED: gl.constexpr, HALVES: gl.constexpr,
                HAS_BIAS: gl.constexpr, ROUND: gl.constexpr, ACT: gl.constexpr, SPLIT_N: gl.constexpr):  # fmt: skip
    """BM = 128: each consumer warpgroup takes 64 rows against the same 128 weight rows; SPLIT_N (BM = 64, half the
    padding): both take all rows, each against its own 128 of 256 weight rows."""
    a_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK], a_desc.layout)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([128, BK], gl.float8e4nv)
    w_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 256 if SPLIT_N else 128, BK], w_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    n_k = gl.cdiv(K, BK)
    gl.warp_specialize([
        (_moe_consumer, (a_smem, w_smem, ready, empty, as_ptr, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr, n_slots,
                         CAP, N_OUT, N_W, K, up_off, alpha, limit, sasm, swse, swsn, swsk, sbe, som, n_k,
                         0, BM, BN_WG, STAGES, UNROLL, GROUP, GATED, HALVES, HAS_BIAS, ROUND, ACT, SPLIT_N)),
        (_moe_consumer, (a_smem, w_smem, ready, empty, as_ptr, ws_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ptr, npad_ptr, n_slots,
                         CAP, N_OUT, N_W, K, up_off, alpha, limit, sasm, swse, swsn, swsk, sbe, som, n_k,
                         1, BM, BN_WG, STAGES, UNROLL, GROUP, GATED, HALVES, HAS_BIAS, ROUND, ACT, SPLIT_N)),
        (_moe_loader, (a_desc, w_desc, a_smem, w_smem, ready, empty, expert_ptr, npad_ptr, CAP, N_OUT, N_W, up_off, n_k, BM, BN_WG,
                       BK, STAGES, GROUP, HALVES, SPLIT_N)),
    ], [4, 1], [REGS, LOADER_REGS])  # fmt: skip
