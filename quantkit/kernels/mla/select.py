"""Which ``mla_decode`` kernel runs: FlashInfer planned once per step where it serves and the caller keeps plans
(``step``, ``state``; a plan reads the host, so not in a graph capture), else Triton, else the reference.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from .. import dispatch
from ..attention.select import PAGE, bind, cdiv, kv_splits, reference
from ..attention.tables import first
from .tables import FLASHINFER_DIMS, FLASHINFER_DTYPES, FLASHINFER_WHY, MLA, SPLITS, MLAConfig

OP = "mla_decode"


@dataclass(frozen=True)
class Shape:
    """``max_keys``: block table width x page."""

    seqs: int
    heads: int
    rank: int
    rope: int
    max_keys: int
    page: int
    dtype: torch.dtype = torch.bfloat16


def flashinfer_refuses(t: dispatch.Target, s: Shape) -> str | None:
    """Why FlashInfer cannot serve ``s``, or None."""
    if not t.has("flashinfer", t.type, OP):
        return "FlashInfer is not installed or not CUDA here"
    if (s.rank, s.rope) != FLASHINFER_DIMS:
        return f"FlashInfer's MLA takes rank {FLASHINFER_DIMS[0]}, rope {FLASHINFER_DIMS[1]}"
    if s.dtype not in FLASHINFER_DTYPES:
        return f"FlashInfer's MLA runs {', '.join(map(str, FLASHINFER_DTYPES))}"
    return None


@functools.lru_cache(maxsize=1024)
def select_mla(t: dispatch.Target, s: Shape, backend: str = dispatch.AUTO, *, triton: str | None = "compiled", planned: bool = False,
               capturing: bool = False, config: MLAConfig | None = None) -> dispatch.Choice:
    """``planned``: the caller keeps plans; ``capturing``: a CUDA graph."""
    refused = flashinfer_refuses(t, s) or ("capturing a CUDA graph" if capturing else None) or (None if planned else "no per-step plan")
    if backend == "flashinfer" or (backend == dispatch.AUTO and refused is None):
        if refused is None:
            return dispatch.Choice("flashinfer.planned", reason=FLASHINFER_WHY)
        return dispatch.Choice("flashinfer", reason=f"asked for, planned on every call ({refused})")
    if (ref := reference(backend, triton)) is not None:
        return ref
    row = first(MLA, triton, s.rank, s.dtype)
    cfg, reason = (config, "the caller's config") if config is not None else (row.config, row.reason)
    splits, why = cfg.num_splits, "given"
    if not splits:
        splits, why = kv_splits(t.sms, s.seqs * cdiv(s.heads, cfg.block_h), s.max_keys, cfg.block_n, **SPLITS)
    kernel = "triton.mla_decode" if splits == 1 else "triton.mla_decode_split"
    fi = f"{refused}: " if backend == dispatch.AUTO else ""
    return dispatch.Choice(kernel, dataclasses.replace(cfg, num_splits=splits), f"{fi}{reason}; {splits} KV splits: {why}")


def choose(q_lat: torch.Tensor, q_rot: torch.Tensor, kv: torch.Tensor, k_rot: torch.Tensor, block_tables: torch.Tensor,
           context_lens: torch.Tensor, block_size: int, scale: float, *, backend: str, triton: str | None,
           config: MLAConfig | None = None, step: object | None = None, state: dict[Any, Any] | None = None) -> dispatch.Choice:
    """:func:`select_mla` for these operands, its leaf (the backend's registered function) bound."""
    s = Shape(q_lat.shape[0], q_lat.shape[1], q_lat.shape[-1], q_rot.shape[-1], block_tables.shape[-1] * block_size, block_size, q_lat.dtype)
    planned = step is not None and state is not None
    capturing = q_lat.is_cuda and torch.cuda.is_current_stream_capturing()
    c = select_mla(dispatch.target(q_lat.device), s, backend, triton=triton, planned=planned, capturing=capturing, config=config)
    fn = dispatch.REGISTRY.table(OP)[c.kernel.split(".")[0]].fn
    if c.kernel == "flashinfer.planned":
        return bind(c, fn, step=step, state=state)
    return bind(c, fn, config=c.config) if c.kernel.startswith("triton") else bind(c, fn)


def register(name: str, fn: Any, triton: str | None = None, **kw: Any) -> None:
    """Backend ``name`` with :func:`choose` as its (and auto's) selection."""
    auto = {"auto_select": functools.partial(choose, backend=dispatch.AUTO, triton=triton)} if name != "flashinfer" else {}
    dispatch.register(OP, name, fn, select=functools.partial(choose, backend=name, triton=triton), **auto, **kw)


DEEPSEEK = Shape(1, 128, 512, 64, 0, PAGE)  # heads per rank: 128 / tp
GRID = ((1, 512), (1, 4096), (1, 32768), (8, 4096), (32, 4096), (32, 32768), (128, 4096), (256, 4096))


def mla_map(t: dispatch.Target) -> list[dispatch.MapRow]:
    triton = "compiled" if t.type == "cuda" else None
    rows = []
    for case, capturing, grid in (("DeepSeek-V3 engine step", False, GRID[1::3]), ("DeepSeek-V3 CUDA graph", True, GRID)):
        for b, ctx in grid:
            s = dataclasses.replace(DEEPSEEK, seqs=b, max_keys=ctx)
            rows.append(dispatch.MapRow(OP, case, f"B {b}, ctx {ctx}", select_mla(t, s, triton=triton, planned=True, capturing=capturing)))
    return rows
