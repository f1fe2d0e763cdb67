"""The ``gemm_fp8_block`` op on Triton: y = dequant(A) @ dequant(W).T (+ bias), float32 accumulation.

Layouts (the :mod:`quantkit.formats` ones, no repacking; DeepSeek-V3 inference/kernel.py
``fp8_gemm``, vLLM ``w8a8_block_fp8_matmul``): A E4M3 [..., K] with F32 scales
[..., ceil(K/128)] (``fp8_block.quantize_act``, 1x128); W E4M3 [N, K] with F32 ``scale_inv``
[ceil(N/128), ceil(K/128)] (128x128 tiles, partial edge tiles allowed).

The kernel and its launch come from a table by M (:data:`FP8_BLOCK_CONFIGS`, measured with
``scripts/bench_kernels.py --sweep``; no autotuning at run time):

* M <= 32: :mod:`.gemm_skinny` (decode: GEMV-like, split-K over every SM, streams the weight once),
  and at M = 33-64 where the wgmma kernel would have few tiles or a very long K (:func:`small_m_prefers_skinny`)
  or cannot run;
* larger M: :mod:`.gemm_wgmma` on sm_90 (warp-specialised Gluon kernel, persistent 128x128
  tiles; at M = 65-256 128x64 or 128x32 tiles where they give the SMs more work
  (:func:`.gemm_wgmma.pick_block_n`) on an 8-stage ring, split-K where K is long and tiles still
  few) where :func:`.gemm_wgmma.why_not`
  allows; elsewhere :mod:`.gemm_block_scaled` (:func:`tiled_fallback`: grouped order, 64x128 tiles on one warpgroup up to M = 512, then
  128x128 on two with TMA loads when rows are 16-byte aligned, else pointer loads -- the table's
  rules; an explicit ``config`` the operands cannot take raises instead).

``by-shape`` (the backend ``auto`` picks on Hopper) runs DeepGEMM (:mod:`.deepgemm`, where it is
built) or this Triton op per the measured crossover table :data:`.scaled_mm.BY_SHAPE_FP8`, and says
which through :func:`.scaled_mm.by_shape_choice`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace

import torch

from .. import dispatch
from .block_scaled import BLOCK_K, INT32_LIMIT, Config, Side, Workspace, block_scaled_mm, tma_ok
from .skinny import SkinnyConfig, skinny_mm
from .wgmma import BLOCK_N as WGMMA_BLOCK_N
from .wgmma import WgmmaConfig, wgmma_mm, why_not
from .scaled_mm import BY_SHAPE_PRIORITY, by_shape_choice, cublas_available, gemm_fp8_block_cublas
from ..triton_numerics import PRIORITY, available, cdiv

KernelConfig = Config | SkinnyConfig | WgmmaConfig
ConfigTable = tuple[tuple[int, KernelConfig], ...]

# (largest M, config).  Measured on the H200 (docs/benchmarks.md): small M is weight-bandwidth
# bound: the small-M kernel (to M = 64 until the ninth pass, see below).  From M = 513 on, 128x128
# tiles on two warpgroups with 4 TMA stages: at M = 1024-8192 6-46% faster than 3 stages and 2-24%
# faster than the best 64x128 one-warpgroup config (fourth pass); 128x256 spills.  Small M: 2 split-K programs per SM (sixth pass, all 14 served
# shapes at M = 1 / 16 / 64, CUDA graphs): geomean 1.07-1.08x the former 4 (which the >= 30 MB
# weights had already dropped), at worst 0.97x; 1 or 3 per SM and 6 stages were slower.
# Seventh pass: from M = 65 the warp-specialised wgmma kernel, 5 stages, promotion groups of 4 K
# blocks, TMA-store epilogue.  CUDA graphs, same run as cuBLAS: geomean 0.93 / 0.95 / 0.98 / 1.01x
# cuBLAS at M = 128 / 256 / 512 / 1024 on 8 served shapes (the 64x128 tiled config: 0.76 / 0.75 /
# 0.68 / 0.66x), 1.01-1.03x over all 14 at M = 1024-8192.  tiled_fallback where it cannot run.
# Ninth pass (all 14 shapes at M = 1-128, CUDA graphs, clean L2): the wgmma kernel from M = 33, where it
# beat the small-M kernel on 10 / 11 of 14 shapes at M = 48 / 64 (geomean 0.93 / 0.98x prepared cuBLAS
# against 0.81 / 0.84x), except by :func:`small_m_prefers_skinny`.  Thirteenth pass: split-K at M = 65-128
# (:func:`.gemm_wgmma.splits`: long K on few tiles -- DeepSeek-V3 o, q_a+kv_a, expert gate_up, Qwen3-235B o
# -- 2 K runs a tile; the other 10 shapes keep one).  Graph-timed on all 14 shapes: geomean cuBLAS / ours
# 0.94 / 0.98 / 1.00 / 1.01 at M = 65 / 80 / 96 / 128, before 0.94 / 0.96 / 0.98 / 0.98; at M = 96-128 the four
# split shapes run 2-11% faster, at M = 65-80 DeepSeek-V3 o 4-7% slower (the others 1% slower to 11% faster).
# At M = 33-64 splitting tied or lost; at M = 256 it lost on 2 of the 3 shapes it would split.
# Eighteenth pass: no split-K where K <= 2048 (``unsplit_kb``): the last-arriver reduction costs about 2 us a call
# (0.5 us each for the partial's store, the counter, the reload), more than splitting a K of <= 16 blocks saves.
# Same-run A/B, three alternating repetitions: DeepSeek-V3 expert down (7168, 2048) 1.10-1.20x and Qwen3-235B expert
# down (4096, 1536) 1.10-1.16x at M = 1-24; q_b and kv_b were not split before; the others keep their splits.
SMALL_M = SkinnyConfig(block_n=64, waves=2, num_warps=4, num_stages=4, unsplit_kb=16)
FP8_BLOCK_CONFIGS: ConfigTable = (
    (32, SMALL_M),
    (64, WgmmaConfig(stages=5, unroll=4)),
    (256, WgmmaConfig(stages=8, unroll=4, split_k=0, block_n=0)),  # sixteenth pass: 128x64 / 128x32 tiles where they fill the SMs
    (INT32_LIMIT, WgmmaConfig(stages=5, unroll=4)),
)
SMALL_M_MAX = 64  # the small-M kernel's range: past the table's row where the wgmma kernel starves or cannot run


def small_m_prefers_skinny(m: int, n: int, k: int) -> bool:
    """At M <= 64 the wgmma kernel runs one 128x128 tile per program without split-K: with fewer than 48
    column tiles on K > 4096, or a K of 16384 or more, its few programs each walk a long K, and the
    small-M kernel (which splits K over every SM) is faster (ninth pass: DeepSeek-V3 q_a+kv_a 15.5 against
    22.4 us at M = 64, expert gate_up and Qwen3-235B o 4-5%; thirteenth pass: DeepSeek-V3 o, 56 tiles on
    K = 16384, 48.4 / 49.6 / 51.5 against 63.2 / 57.1 / 55.0 us at M = 33 / 48 / 64, where split-K on the
    wgmma kernel did not help)."""
    return m <= SMALL_M_MAX and k > 4096 and (cdiv(n, WGMMA_BLOCK_N) < 48 or k >= 16384)


TILED_MID = Config(64, 128, group=8, num_warps=4, num_stages=4)  # the tiled kernel up to M = 512
TILED_LARGE = Config(128, 128, group=8, tma=True, num_warps=8, num_stages=4)  # and above (fourth pass)


def tiled_fallback(m: int) -> Config:
    """The tiled kernel's config where the wgmma kernel cannot run."""
    return TILED_MID if m <= 512 else TILED_LARGE


def pick_config(table: ConfigTable, m: int) -> KernelConfig:
    for m_max, cfg in table:
        if m <= m_max:
            return cfg
    raise ValueError(f"no GEMM configuration for M={m}")


def table_config(table: ConfigTable, a: Side, w: Side, out_dtype: torch.dtype = torch.bfloat16) -> KernelConfig:
    """The table's config for these operands: the wgmma kernel only where it runs
    (:func:`.gemm_wgmma.why_not`), else :func:`tiled_fallback` (the small-M kernel up to M = 64, as where
    :func:`small_m_prefers_skinny`); TMA only where rows are 16-byte aligned."""
    m, (n, k) = a.q.shape[0], w.q.shape
    cfg = pick_config(table, m)
    if isinstance(cfg, WgmmaConfig):
        if small_m_prefers_skinny(m, n, k):
            return SMALL_M
        if why_not(a, w, out_dtype) is not None:
            cfg = SMALL_M if m <= SMALL_M_MAX else tiled_fallback(m)
    if isinstance(cfg, Config) and cfg.tma and not tma_ok(a.q, w.q):
        return replace(cfg, tma=False, persistent=0)
    return cfg


def run(a: Side, w: Side, bias: torch.Tensor | None, out_dtype: torch.dtype, cfg: KernelConfig, workspace: Workspace | None = None,
        checked: bool = False) -> torch.Tensor:  # fmt: skip
    """Launch the kernel ``cfg`` names (small-M or tiled) on 2-D operands (``checked``: ``cfg`` came
    from :func:`table_config`, which has asked the wgmma rules already)."""
    if isinstance(cfg, SkinnyConfig):
        return skinny_mm(a, w, bias, out_dtype, cfg, workspace)
    if isinstance(cfg, WgmmaConfig):
        return wgmma_mm(a, w, bias, out_dtype, cfg, checked, workspace)
    return block_scaled_mm(a, w, bias, out_dtype, cfg, workspace)


def flatten_act(a: torch.Tensor, a_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] activations and [..., G] scales -> 2-D views [M, K], [M, G]."""
    assert a.shape[:-1] == a_scale.shape[:-1], f"activation {tuple(a.shape)} and its scales {tuple(a_scale.shape)} disagree"
    if a.dim() == 2:
        return a, a_scale
    return a.reshape(-1, a.shape[-1]), a_scale.reshape(-1, a_scale.shape[-1])


def matmul(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    a_side: Callable[[torch.Tensor, torch.Tensor], Side],
    w: Side,
    table: ConfigTable,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: KernelConfig | None,
    workspace: Workspace | None,
) -> torch.Tensor:
    """[..., K] activations (their operand built by ``a_side`` from the 2-D views) x the weight
    operand -> out_dtype [..., N]; ``config`` or the table's for these operands."""
    a2, s2 = flatten_act(a, a_scale)
    sa = a_side(a2, s2)
    out = run(sa, w, bias, out_dtype, config or table_config(table, sa, w, out_dtype), workspace, checked=config is None)
    return out if a.dim() == 2 else out.reshape(*a.shape[:-1], w.q.shape[0])


def _act_side(q: torch.Tensor, s: torch.Tensor) -> Side:
    """Activation rows with 1x128 scales (F32) as a GEMM operand."""
    return Side(q, s.to(torch.float32), 1, BLOCK_K)


def gemm_fp8_block(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: KernelConfig | None = None,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """A E4M3 [..., K] (F32 1x128 scales [..., ceil(K/128)]) x W E4M3 [N, K] (F32 [ceil(N/128), ceil(K/128)]) -> [..., N]."""
    sw = Side(w, w_scale.to(torch.float32), BLOCK_K, BLOCK_K)
    return matmul(a, a_scale, _act_side, sw, FP8_BLOCK_CONFIGS, bias, out_dtype, config, workspace)


def fp8_block_config(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                     out_dtype: torch.dtype = torch.bfloat16) -> KernelConfig:  # fmt: skip
    """The config :func:`gemm_fp8_block` runs for these operands (its table's, by the operands' rules)."""
    a2, s2 = flatten_act(a, a_scale)
    return table_config(FP8_BLOCK_CONFIGS, _act_side(a2, s2), Side(w, w_scale.to(torch.float32), BLOCK_K, BLOCK_K), out_dtype)


def gemm_fp8_block_by_shape(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """cuBLAS, DeepGEMM or Triton per :func:`.scaled_mm.by_shape_choice` (which says what runs)."""
    m = a.numel() // a.shape[-1]
    choice = by_shape_choice(m, *w.shape, device=a.device)
    if choice == "deepgemm" and out_dtype != torch.bfloat16:
        choice = "triton"  # DeepGEMM writes bf16: a float32 output would lose its bits
    if choice == "cublas":
        return gemm_fp8_block_cublas(a, a_scale, w, w_scale, bias, out_dtype)
    if choice == "deepgemm":
        from . import deepgemm

        try:
            return deepgemm.gemm_fp8_block_deepgemm(a, a_scale, w, w_scale, bias, out_dtype)
        except deepgemm.BuildError as err:  # e.g. an nvcc that cannot target sm_90a: Triton from now on
            why = str(err).splitlines()[0]
            deepgemm.disable(a.device, why)
            warnings.warn(f"by-shape: DeepGEMM disabled on {a.device}, running Triton ({why})", stacklevel=2)
    return gemm_fp8_block(a, a_scale, w, w_scale, bias, out_dtype)


def _by_shape_available(device: torch.device) -> dispatch.Availability:
    for why in (available(device), cublas_available(device)):
        if not why.ok:
            return why
    return dispatch.Availability(True)


dispatch.register("gemm_fp8_block", "triton", gemm_fp8_block, available=available, priority=PRIORITY)
dispatch.register("gemm_fp8_block", "by-shape", gemm_fp8_block_by_shape, available=_by_shape_available, priority=BY_SHAPE_PRIORITY)
