"""Which leaf runs a ``fused_moe`` call, with which tiles: :func:`select`, a pure function of target and shapes.
Leaves: ``triton.moe_steps`` (gathered rows, any shape), ``triton.sorted`` (expert-sorted rows through TMA),
``triton.sorted_wgmma`` (the same on the warp-specialised Gluon kernel, sm_90).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ... import formats
from ...formats import Grid
from .. import dispatch
from ..dispatch import Choice, MapRow, Target
from ..triton_numerics import interpreted
from . import tables
from .fused_moe_ref import ExpertWeights, MoeSpec, check_moe
from .sorted_tokens import WGMMA_BLOCK_MS
from .tables import MoeConfig


WGMMA_FORMATS = ("fp8-block",)  # the formats the warp-specialised kernel is written for


def compiled_sm90(target: Target) -> bool:
    return target.type == "cuda" and target.capability >= (9, 0)


def _grid(fmt: str) -> Grid:
    """The experts' weight scales: 1x32 E8M0 (MX) or 128x128 F32 tiles (FP8-block)."""
    return formats.get(fmt).weight_scale


def sorted_why_not(fmt: str, interleaved: bool, hidden: int, inter: int, cfg: MoeConfig, dense: bool) -> str | None:
    """None when the sorted-row kernel takes these experts with ``cfg``'s tiles, else the rule they break."""
    if not dense:
        return "TMA needs contiguous, 16-byte aligned weights"
    if hidden % 16 or inter % 16:
        return f"TMA needs 16-byte rows, got H {hidden}, I {inter}"
    grid = _grid(fmt)
    if grid.e8m0:
        return None if cfg.upcast else "MX experts take sorted rows on bf16 operands (upcast) only"
    rows1 = 2 * cfg.block_n1 if interleaved else cfg.block_n1
    if grid.rows % rows1 or grid.rows % cfg.block_n2 or not (interleaved or inter % grid.rows == 0):
        return "an FP8-block weight tile must lie under one scale block"
    return None


def wgmma_why_not(target: Target, fmt: str, interleaved: bool, hidden: int, inter: int, cfg: MoeConfig, dense: bool) -> str | None:
    """None when the wgmma kernel takes both GEMMs (its tiles: 64 intermediate, 128 output columns)."""
    if fmt not in WGMMA_FORMATS:
        return f"the wgmma kernel takes FP8-block experts only, got {fmt}"
    if cfg.block_m not in WGMMA_BLOCK_MS:
        return f"expert blocks of 64 or 128 rows only, got {cfg.block_m}"
    why = sorted_why_not(fmt, interleaved, hidden, inter, replace(cfg, block_n1=64, block_n2=128), dense)
    if why is not None:
        return why
    if target.type != "cuda" or target.capability[0] != 9:
        return f"wgmma needs compiled sm_90, got {target.type} sm_{target.capability[0]}{target.capability[1]}"
    if target.optional is None:  # a probed device: ask this Triton
        from ..gemm.wgmma import gluon_missing

        return gluon_missing()
    return None


def fit(cfg: MoeConfig, fmt: str) -> MoeConfig:
    """``cfg`` for ``fmt``: MX experts step 128 K columns; only they take diag dots."""
    mx = _grid(fmt).e8m0
    if cfg.upcast and not mx:
        raise ValueError(f"fused_moe {cfg.name()}: upcast is exact only with power-of-two (MX) scales")
    return replace(cfg, block_k=tables.BLOCK_K if mx else cfg.block_k, diag=cfg.diag and mx and not cfg.upcast)


@functools.lru_cache(maxsize=4096)  # a pure function of hashables, asked once per MoE layer per step
def select(target: Target, tokens: int, experts: int, top_k: int, hidden: int, intermediate: int, fmt: str, *,
           interleaved: bool, dense: bool = True, config: MoeConfig | None = None, backend: str = "auto") -> Choice:  # fmt: skip
    """The leaf and config of one call.  ``dense``: both weights contiguous and 16-byte aligned; ``config``: the
    caller's tiles (a leaf that cannot run them raises, except sorted rows, which fall back to gathered ones)."""
    if backend == dispatch.REFERENCE or (backend == dispatch.AUTO and target.type != "cuda"):
        return Choice(dispatch.REFERENCE, reason="compiled Triton needs CUDA: the torch reference")
    if config is None:
        row = tables.lookup(target.capability, fmt, tokens * top_k / max(experts, 1))
        cfg, why = row.config, row.reason
        if _grid(fmt).e8m0 and cfg.sorted_rows and not interleaved:
            cfg, why = replace(cfg, mx_step=tables.MX_STEP_CONCAT), why + "; concatenated gate/up: 64-column MX steps, 1.07x"
    else:
        cfg, why = config, "the caller's config"
    cfg = fit(cfg, fmt)
    if cfg.wgmma:
        bad = wgmma_why_not(target, fmt, interleaved, hidden, intermediate, cfg, dense)
        if bad is None:
            return Choice("triton.sorted_wgmma", replace(cfg, pdl=False), why)
        if config is not None:
            raise ValueError(f"fused_moe {cfg.name()}: {bad}")
        cfg, why = tables.PREFILL_TILED, f"prefill, {bad}: Triton tiles on sorted rows"
    if cfg.sorted_rows:
        bad = sorted_why_not(fmt, interleaved, hidden, intermediate, cfg, dense)
        if bad is None:
            return Choice("triton.sorted", replace(cfg, pdl=False), why)
        cfg, why = replace(cfg, sorted_rows=False), f"{why}; {bad}: gathered rows"
    return Choice("triton.moe_steps", replace(cfg, pdl=cfg.pdl and compiled_sm90(target)), why)


def select_call(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights,
                spec: MoeSpec, *, config: MoeConfig | None = None, x_q: tuple[torch.Tensor, torch.Tensor] | None = None) -> Choice:  # fmt: skip
    """:func:`select` for one call's tensors (interpreted or on ROCm, no sm_90 feature runs)."""
    t, h, inter, e = check_moe(x, topk_weights, topk_ids, w13, w2)
    target = dispatch.target(x.device)
    if interpreted() or torch.version.hip is not None:
        target = replace(target, capability=(0, 0))
    dense = all(w.q.is_contiguous() and w.q.data_ptr() % 16 == 0 for w in (w13, w2))
    return select(target, t, e, topk_ids.shape[1], h, inter, w13.fmt, interleaved=spec.interleaved, dense=dense, config=config, backend="triton")


def kernel_map(target: Target) -> list[MapRow]:
    """``fused_moe``'s kernel map: the served models' expert shapes, each format with tiles, each token count."""
    return [MapRow("fused_moe", f"{name} {fmt}", str(t), select(target, t, e, k, h, i, fmt, interleaved=il))
            for name, e, k, h, i, il in tables.MAP_MODELS for fmt in tables.H200 for t in tables.MAP_TOKENS]  # fmt: skip
