"""FP8-block GEMM on Hopper: warp-specialised, persistent, written in Gluon (:mod:`.wgmma_gluon` has the kernels).

The same op as :mod:`.block_scaled` (1x128 activation and 128x128 weight F32 scales, float32 accumulation promoted per
128-deep K block), built as DeepGEMM builds it: a TMA warp feeds two 64-row consumer warpgroups that promote each block
while the tensor core works on the next (Triton's ``tl.dot`` loop waits for every dot before promoting it).  Split-K
reduces deterministically through a :class:`.block_scaled.Workspace`.

Runs where :func:`why_not` is None: compiled NVIDIA sm_90 with Gluon's Hopper API, E4M3 rows 16-byte aligned (TMA),
bf16 / fp16 / fp32 output.  The CPU interpreter cannot run Gluon: CI compiles the kernel for sm_90 and checks the host
rules; the H200 checks the numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from types import ModuleType

import torch

from ..dispatch import SM90_SMEM, Availability, capability, sm_count, wave_key
from .block_scaled import BLOCK_K, INT32_LIMIT, WORKSPACE, Side, Workspace, check_side, tma_ok
from ..triton_numerics import cdiv, interpreted

BLOCK_M = 128  # two consumer warpgroups of 64 rows
BLOCK_N = 128  # one weight scale per tile column block
LOADER_REGS = 40  # registers of the TMA warp (setmaxnreg)
CONSUMER_REGS = 232  # 8 x 32 x 232 + 4 x 32 x 40 fit the 64K register file
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class WgmmaConfig:
    """One launch (128 x ``block_n`` tiles, one program per SM); :func:`resolve` fills the 0s (``split_k``:
    :func:`splits`; ``block_n``: :func:`pick_block_n`)."""

    stages: int = 5
    unroll: int = 4
    group: int = 8
    regs: int = CONSUMER_REGS
    split_k: int = 1
    block_n: int = BLOCK_N

    def __str__(self) -> str:
        return self.name()

    def name(self) -> str:
        bn = "auto" if self.block_n == 0 else str(self.block_n)
        name = f"wgmma128x{bn}/st{self.stages}/u{self.unroll}" + (f"/g{self.group}" if self.group != 8 else "")
        return name + ("" if self.split_k == 1 else "/sauto" if self.split_k == 0 else f"/s{self.split_k}")


BLOCK_NS = (128, 64, 32)


def ring_stages(stages: int, bn: int, out_bytes: int) -> int:
    """``stages`` where the ring fits beside the two [64, bn] output staging tiles, else the deepest that fits."""
    staging, per = 2 * (BLOCK_M // 2) * bn * out_bytes, (BLOCK_M + bn) * BLOCK_K
    if staging + stages * per + 1024 <= SM90_SMEM:
        return stages
    return (SM90_SMEM - staging - 4096) // per


def pick_block_n(m: int, n: int, sms: int) -> int:
    """DeepGEMM's rule: the fewest waves of tiles over the SMs, then the fullest last wave, then the wider tile."""
    return min(BLOCK_NS, key=lambda bn: (*wave_key(cdiv(m, BLOCK_M) * cdiv(n, bn), sms), -bn))


MIN_SPLIT_BLOCKS = 28  # K blocks per run at the least: shorter runs lose to one run per tile


def splits(m: int, n: int, k: int, cfg: WgmmaConfig, sms: int) -> tuple[int, int]:
    """(K runs per tile, K blocks per run), none empty; ``split_k`` 0: as many runs as fill the SMs once, each of
    at least MIN_SPLIT_BLOCKS."""
    n_k = cdiv(k, BLOCK_K)
    want = cfg.split_k
    if want == 0:
        tiles = cdiv(m, BLOCK_M) * cdiv(n, cfg.block_n or pick_block_n(m, n, sms))
        want = max(1, min(sms // tiles, n_k // MIN_SPLIT_BLOCKS))
    kper = cdiv(n_k, max(1, min(want, n_k)))
    return cdiv(n_k, kper), kper


def resolve(cfg: WgmmaConfig, m: int, n: int, k: int, sms: int, out_bytes: int) -> WgmmaConfig:
    """The launch ``cfg`` makes for this shape: its tile width, ring depth and K runs, picked where it leaves them 0."""
    cfg = replace(cfg, block_n=cfg.block_n or pick_block_n(m, n, sms))
    return replace(cfg, stages=ring_stages(cfg.stages, cfg.block_n, out_bytes), split_k=splits(m, n, k, cfg, sms)[0])


@functools.cache
def kernels() -> ModuleType:
    """The Gluon kernels, imported on first use (they need Gluon's Hopper API)."""
    from . import wgmma_gluon as gemm_wgmma_gluon

    return gemm_wgmma_gluon




def gluon_missing() -> str | None:
    """Why this Triton cannot build the kernel (None when it can)."""
    try:
        kernels()
    except ImportError as e:
        return f"this Triton has no Gluon Hopper API ({e})"
    return None


def wgmma_available(device: torch.device) -> Availability:
    if interpreted():
        return Availability(False, reason="Gluon kernels do not run in Triton's CPU interpreter")
    if device.type != "cuda" or torch.version.hip is not None:
        return Availability(False, reason=f"wgmma needs an NVIDIA GPU, got {device.type}")
    major, minor = capability(device)
    if major != 9:
        return Availability(False, reason=f"wgmma is sm_90 only, got sm_{major}{minor}")
    missing = gluon_missing()
    return Availability(False, reason=missing) if missing else Availability(True)


def why_not(a: Side, w: Side, out_dtype: torch.dtype) -> str | None:
    """None when :func:`wgmma_mm` takes these operands, else the rule they break."""
    if (a.rps, a.kps, w.rps, w.kps) != (1, BLOCK_K, BLOCK_K, BLOCK_K):
        return f"1x128 activation and 128x128 weight scales only, got {a.rps}x{a.kps} and {w.rps}x{w.kps}"
    if a.s.dtype != torch.float32 or w.s.dtype != torch.float32:
        return f"F32 scales only, got {a.s.dtype} and {w.s.dtype}"
    if out_dtype not in OUT_DTYPES:
        return f"output must be one of {OUT_DTYPES}, got {out_dtype}"
    if not tma_ok(a.q, w.q):
        return f"TMA needs 16-byte aligned E4M3 rows (K % 16 == 0), got row strides {a.q.stride(0)} and {w.q.stride(0)}"
    if a.q.shape[0] * w.q.shape[0] >= INT32_LIMIT:
        return f"{a.q.shape[0]} x {w.q.shape[0]} outputs overflow 32-bit offsets"
    avail = wgmma_available(a.q.device)
    return None if avail.ok else avail.reason


@functools.cache
def _layout(rows: int, cols: int, dtype: torch.dtype):
    gl = kernels().gl
    return gl.NVMMASharedLayout.get_default_for([rows, cols], {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16,
                                                               torch.float16: gl.float16, torch.float32: gl.float32}[dtype])  # fmt: skip


def descriptor(t: torch.Tensor, rows: int, cols: int):
    """Gluon TMA descriptor of a 2-D tensor in [rows, cols] boxes, NVMMA-swizzled."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [rows, cols], _layout(rows, cols, t.dtype))


def wgmma_mm(
    a: Side, w: Side, bias: torch.Tensor | None, out_dtype: torch.dtype, cfg: WgmmaConfig, checked: bool = False,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """[M, K] x [N, K] -> out_dtype [M, N] (+ bias [N]); raises where :func:`why_not` names a rule (``checked``: the
    selection has asked it)."""
    m, k = a.q.shape
    n = w.q.shape[0]
    check_side(a, "activation", k)
    check_side(w, "weight", k)
    assert bias is None or tuple(bias.shape) == (n,), f"bias must be [{n}], got {None if bias is None else tuple(bias.shape)}"
    reason = None if checked else why_not(a, w, out_dtype)
    if reason:
        raise ValueError(f"gemm_fp8_block {cfg.name()}: {reason}")
    out = torch.empty((m, n), dtype=out_dtype, device=a.q.device)
    if m == 0 or n == 0:
        return out
    tma_store = (n * out.element_size()) % 16 == 0  # else masked stores: TMA needs 16-byte aligned output rows
    sms = sm_count(out.device)
    if cfg.block_n == 0 or cfg.split_k == 0:
        cfg = resolve(cfg, m, n, k, sms, out.element_size())
    bn = cfg.block_n
    assert bn in BLOCK_NS, f"block_n must be one of {BLOCK_NS} (or 0: picked), got {bn}"
    stages = ring_stages(cfg.stages, bn, out.element_size())
    c_desc = descriptor(out, BLOCK_M // 2, bn) if tma_store else None
    tiles = cdiv(m, BLOCK_M) * cdiv(n, bn)
    n_split, kper = splits(m, n, k, cfg, sms)
    part = count = out
    if n_split > 1:  # float32 [n_split, tiles, 2 halves, 64 x bn], one counter per half tile
        ws = workspace or WORKSPACE
        part = ws.partials(n_split * tiles * BLOCK_M * bn, out.device)
        count = ws.counters(tiles * 2, out.device)
    grid = (min(tiles * n_split, sms),)
    kernels().fp8_block_gemm_ws[grid](
        descriptor(a.q, BLOCK_M, BLOCK_K), descriptor(w.q, bn, BLOCK_K), c_desc, a.s, w.s,
        bias if bias is not None else out, out, part, count, m, n, k,
        a.s.stride(0), a.s.stride(1), w.s.stride(0), w.s.stride(1), out.stride(0), n_split, kper,
        BM=BLOCK_M, BN=bn, BK=BLOCK_K, STAGES=stages, UNROLL=cfg.unroll, GROUP=cfg.group,
        REGS=cfg.regs, LOADER_REGS=LOADER_REGS, HAS_BIAS=bias is not None, TMA_STORE=tma_store, SPLIT_K=n_split > 1, num_warps=4,
    )  # fmt: skip
    return out
