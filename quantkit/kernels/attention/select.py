"""Which attention kernel runs: per op a pure function of (target, call shape, request, how Triton runs) -> Choice;
the kernel map; the split-KV rule MLA shares.  ``triton``: "compiled", "interpreter" (explicit only) or None.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import dispatch
from .tables import DECODE, PREFILL, DecodeConfig, PrefillConfig, first

PAGE = 16  # the engine's block size


@dataclass(frozen=True)
class Shape:
    """What the selection reads of a call; ``max_keys``: block table width x page."""

    seqs: int
    tokens: int
    hq: int
    hkv: int
    d: int
    dv: int
    max_keys: int = 0
    window: int | None = None
    sinks: bool = False
    page: int = 0
    dtype: torch.dtype = torch.bfloat16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_splits(sms: int, groups: int, max_keys: int, block_n: int, programs_per_sm: int, max_splits: int) -> tuple[int, str]:
    """(splits per (sequence, head group), why), from shapes only so one CUDA graph serves any context; >= 1 key block
    each.  ``programs_per_sm``: at most that many programs per SM (a partial second wave costs more than it gains:
    B 32, ctx 4096 read 77% of HBM in 2 splits, 68% in 3); 0: at least two per SM (MLA)."""
    groups = max(groups, 1)
    want = programs_per_sm * sms // groups if programs_per_sm else cdiv(2 * sms, groups)
    splits = max(1, min(want, cdiv(max_keys, block_n), max_splits))
    if splits < want:
        return splits, "one per key block" if splits == cdiv(max_keys, block_n) else f"at most {max_splits}"
    if programs_per_sm:
        fits = f"x {splits} within" if want >= 1 else "exceed"
        return splits, f"{groups} groups {fits} {programs_per_sm} programs per SM on {sms}"
    return splits, f"{groups} groups x {splits} fill {sms} SMs at least twice"


def reference(backend: str, triton: str | None) -> dispatch.Choice | None:
    """The reference's Choice where the request runs it, else None."""
    if backend == dispatch.REFERENCE:
        return dispatch.Choice(dispatch.REFERENCE, reason="asked for")
    if backend == dispatch.AUTO and triton != "compiled":
        return dispatch.Choice(dispatch.REFERENCE, reason="no compiled Triton here: the reference")
    if triton is None:
        raise ValueError("the Triton kernels do not run here")
    return None


@functools.lru_cache(maxsize=1024)
def select_prefill(t: dispatch.Target, s: Shape, backend: str = dispatch.AUTO, *, triton: str | None = "compiled",
                   config: PrefillConfig | None = None) -> dispatch.Choice:
    """``attention_prefill``: tiles by head dim and dtype."""
    if (ref := reference(backend, triton)) is not None:
        return ref
    if config is not None:
        return dispatch.Choice("triton.prefill", config, "the caller's config")
    row = first(PREFILL, triton, s.d, s.dtype)
    return dispatch.Choice("triton.prefill", row.config, row.reason)


@functools.lru_cache(maxsize=1024)
def select_decode(t: dispatch.Target, s: Shape, backend: str = dispatch.AUTO, *, triton: str | None = "compiled",
                  config: DecodeConfig | None = None) -> dispatch.Choice:
    """``attention_decode``: one split writes the output; more add the merge kernel."""
    if (ref := reference(backend, triton)) is not None:
        return ref
    row = first(DECODE, triton, s.d, s.dtype)
    cfg, reason = (config, "the caller's config") if config is not None else (row.config, row.reason)
    if cfg.num_splits:
        splits, why = cfg.num_splits, "given"
    else:
        keys = min(s.max_keys, s.window) if s.window is not None else s.max_keys
        splits, why = kv_splits(t.sms, s.seqs * s.hkv, keys, cfg.block_n, cfg.programs_per_sm, cfg.max_splits)
    kernel = "triton.decode" if splits == 1 else "triton.decode_split"
    return dispatch.Choice(kernel, dataclasses.replace(cfg, num_splits=splits), f"{reason}; {splits} KV splits: {why}")


def decode_shape(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, block_size: int,
                 sinks: torch.Tensor | None, window: int | None) -> Shape:
    b, hq, d = q.shape
    return Shape(b, b, hq, k_cache.shape[1], d, v_cache.shape[2], block_tables.shape[1] * block_size, window, sinks is not None,
                 block_size, q.dtype)


def prefill_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, sinks: torch.Tensor | None,
                  window: int | None, block_tables: torch.Tensor | None, block_size: int) -> Shape:
    paged = block_tables is not None
    return Shape(cu_seqlens_q.shape[0] - 1, q.shape[0], q.shape[1], k.shape[1], q.shape[2], v.shape[2],
                 block_tables.shape[1] * block_size if paged else 0, window, sinks is not None, block_size if paged else 0, q.dtype)


def bind(choice: dispatch.Choice, fn: Callable[..., Any], **kw: Any) -> dispatch.Choice:
    """``choice`` running ``fn`` with ``kw`` for the call's keyword arguments."""
    return dispatch.Choice(choice.kernel, choice.config, choice.reason, lambda *args, **_: fn(*args, **kw))


# the kernel map: GPT-OSS-20B (window 128 on alternate layers), Qwen3-30B-A3B, DeepSeek-V3's prefill
MODELS = {
    "GPT-OSS-20B full (64/8 heads, d 64, sinks)": Shape(1, 1, 64, 8, 64, 64, sinks=True),
    "GPT-OSS-20B window 128 (64/8 heads, d 64, sinks)": Shape(1, 1, 64, 8, 64, 64, window=128, sinks=True),
    "Qwen3-30B-A3B (32/4 heads, d 128)": Shape(1, 1, 32, 4, 128, 128),
}
DEEPSEEK_PREFILL = ("DeepSeek-V3 MLA prefill (128 heads, d 192/128)", Shape(1, 1, 128, 128, 192, 128))
DECODE_GRID = ((1, 512), (1, 4096), (1, 32768), (8, 4096), (32, 4096), (32, 32768), (128, 4096), (256, 4096))


def triton_on(t: dispatch.Target) -> str | None:
    return "compiled" if t.type == "cuda" else None


def prefill_map(t: dispatch.Target) -> list[dispatch.MapRow]:
    cases = [*MODELS.items(), DEEPSEEK_PREFILL]
    return [dispatch.MapRow("attention_prefill", case, "any T", select_prefill(t, s, triton=triton_on(t))) for case, s in cases]


def decode_map(t: dispatch.Target) -> list[dispatch.MapRow]:
    rows = []
    for case, s in MODELS.items():
        for b, ctx in DECODE_GRID:
            shape = dataclasses.replace(s, seqs=b, tokens=b, max_keys=ctx, page=PAGE)
            rows.append(dispatch.MapRow("attention_decode", case, f"B {b}, ctx {ctx}", select_decode(t, shape, triton=triton_on(t))))
    return rows
