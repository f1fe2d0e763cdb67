"""The conversion plan: every output tensor (name, dtype, shape) and the path that produces it, known
from the source headers and config alone, before any tensor data is read.

Paths (what ``quantkit.json`` records per tensor; "exact" ones never round, so ``--rounding`` does not apply):
  copy              source bytes (or a row window of them) unchanged                       exact
  copy-fp8-block    FP8 weight bytes unchanged, block scales widened to F32               exact
  mxfp4->mxfp8      E2M1 codes re-encoded as E4M3, E8M0 scales unchanged                    exact
  fp8-block->mxfp8  exact when every tile scale is a power of two (decided per tensor when run;
                    otherwise dequantize to F32 and requantize)
  mxfp4->bf16       MXFP4 dequantized to BF16 (every E2M1 x 2^k value fits)                  exact
  copy-mxfp8        MXFP8 weight and E8M0 scale bytes unchanged                            exact
  copy-mxfp4        MXFP4 packed codes and E8M0 scale bytes unchanged (GPT-OSS ``_blocks`` and
                    compressed-tensors ``weight_packed`` hold the same bytes)              exact
  mxfp8->bf16       MXFP8 dequantized to BF16 (every E4M3 x 2^k value fits)                  exact
  mxfp8->fp8-block  exact for each 128x128 tile whose per-32 scales can share the tile's largest one
                    without rounding an element (decided per tile when run; other tiles requantized)
  quantize          float source -> target format                                          rounds
  requantize        quantized source -> F32 -> another quantized format                     rounds
  dequantize        FP8 (blocks, rows or tensor) -> F32 -> BF16                             rounds
  cast              a float projection weight cast to BF16 (--to bf16)                      rounds
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field, replace

import torch

from .. import formats
from ..checkpoint import DTYPES, CheckpointError
from ..writer import ShardPlan, TensorSpec, plan_shards
from .items import LINEAR, MODULE, Item
from .qsource import source_scale_fmt
from .options import ConvertOptions, OptionError, uses_rule
from .qconfig import quantization_config
from .source import TensorLoc, locations, open_source

EXACT_PATHS = ("copy", "copy-fp8-block", "copy-mxfp8", "copy-mxfp4", "mxfp4->mxfp8", "mxfp4->bf16", "mxfp8->bf16")


@dataclass(frozen=True)
class Task:
    item: Item
    path: str
    target: str  # a quantized format (--to), "bf16" or "keep"
    outputs: tuple[TensorSpec, ...]  # the weight (or tensor) first, then its scale

    @property
    def transposed_out(self) -> bool:
        """GPT-OSS fused experts written unquantized use transformers' [E, K, N]."""
        return self.item.fused and self.target in ("bf16", "keep")


@dataclass
class Plan:
    src: str
    family: str
    layout: str
    fingerprint: str
    options: ConvertOptions
    scale_fmt: str | None
    config: dict
    locs: dict[str, TensorLoc]
    tasks: list[Task]
    shards: list[ShardPlan]
    side_files: list[str] = field(default_factory=list)
    skipped_side: list[str] = field(default_factory=list)  # side files the path rule refused: "name: reason"
    source_files: dict[str, str] = field(default_factory=dict)  # weight file name -> its resolved path
    owner: dict[str, int] = field(default_factory=dict)  # output tensor name -> index of its task

    def __post_init__(self) -> None:
        self.owner = {s.name: i for i, t in enumerate(self.tasks) for s in t.outputs}

    def recorded_options(self) -> dict:
        return self.options.output_options(self.scale_fmt)

    def job(self) -> dict:
        specs = [[s.name, str(s.dtype), list(s.shape)] for sh in self.shards for s in sh.specs]
        digest = hashlib.sha256(json.dumps(specs).encode()).hexdigest()
        return {"source_fingerprint": self.fingerprint, "options": self.recorded_options(), "plan_sha256": digest}

    def shard_sources(self, index: int) -> list[str]:
        """Names of the source files the tensors of output shard ``index`` are read from."""
        by_path = {p: n for n, p in self.source_files.items()}
        used = {by_path[self.locs[t].path] for i in self.shard_tasks(index) for t in self.tasks[i].item.source.tensors}
        return sorted(used)

    def shard_tasks(self, index: int) -> list[int]:
        """Indices of the tasks with at least one output in shard ``index``, in plan order."""
        out: list[int] = []
        for s in self.shards[index].specs:
            if not out or out[-1] != self.owner[s.name]:
                out.append(self.owner[s.name])
        return out


def ignored(items: list[Item], patterns: tuple[str, ...]) -> set[str]:
    """Names of the projections that --ignore keeps in source precision; a pattern matching none is an error."""
    linear = [it for it in items if it.role == LINEAR]
    names: set[str] = set()
    for p in patterns:
        hit = {it.name for it in linear if it.matches(p)}
        if not hit:
            raise OptionError(f"--ignore {p!r} matches no weight that --to would quantize")
        names |= hit
    return names


def quant_specs(item: Item, to: str) -> tuple[TensorSpec, ...]:
    """The tensors the target format writes a weight as (:meth:`quantkit.formats.Format.stored`), the weight first."""
    try:
        specs = formats.get(to).stored(item.name, item.module, item.shape, item.fused)
    except ValueError as e:
        raise CheckpointError(f"{item.name}: {e}") from None
    return tuple(TensorSpec(*s) for s in specs)


def plain_spec(item: Item, dtype: torch.dtype) -> TensorSpec:
    shape = item.shape
    if item.fused:  # transformers' BF16 GPT-OSS experts: [E, K, N]
        shape = (*shape[:-2], shape[-1], shape[-2])
    return TensorSpec(item.name, dtype, shape)


def quantized_path(kind: str, to: str, scale_fmt: str | None, src_fmt: str | None) -> str:
    """The path from a source of ``kind`` to quantized target ``to`` (the table in the module docstring)."""
    if kind == "plain":
        return "quantize"
    if kind == to == "fp8-block":
        return "copy-fp8-block" if scale_fmt == "float" or scale_fmt == src_fmt else "requantize"
    if kind == to and kind in ("mxfp8", "mxfp4"):  # MXFP4: GPT-OSS blocks and compressed-tensors packed bytes are the same
        return f"copy-{kind}"
    return {("mxfp4", "mxfp8"): "mxfp4->mxfp8", ("fp8-block", "mxfp8"): "fp8-block->mxfp8",
            ("mxfp8", "fp8-block"): "mxfp8->fp8-block"}.get((kind, to), "requantize")


def decide(item: Item, o: ConvertOptions, keep: set[str], scale_fmt: str | None, src_fmt: str | None) -> Task:
    kind = item.source.kind
    if item.role == LINEAR and quantizes(o.to) and item.name not in keep:
        return Task(item, quantized_path(kind, o.to, scale_fmt, src_fmt), o.to, quant_specs(item, o.to))
    if kind in ("mxfp4", "mxfp8"):
        return Task(item, f"{kind}->bf16", "bf16", (plain_spec(item, torch.bfloat16),))
    if kind != "plain":  # FP8 blocks, rows or tensor
        return Task(item, "dequantize", "bf16", (plain_spec(item, torch.bfloat16),))
    if o.to == "bf16" and item.role == LINEAR and item.source.dtype != "BF16":
        return Task(item, "cast", "bf16", (plain_spec(item, torch.bfloat16),))
    return Task(item, "copy", "keep", (plain_spec(item, DTYPES[item.source.dtype]),))


def quantizes(to: str) -> bool:
    """Whether target ``to`` quantizes projections (every one but bf16)."""
    return formats.get(to).weight_scale is not None


def resolve_scale_fmt(o: ConvertOptions, src_fmt: str | None) -> str | None:
    if not formats.get(o.to).scale_fmts:
        return None
    fmt = o.scale_fmt or src_fmt or "float"
    if o.scale_rule is not None and not uses_rule(o.to, fmt):
        raise OptionError(f"--scale-rule does not apply: {o.to} scales here are {fmt!r} (pass --scale-fmt ue8m0)")
    return fmt


def upstream_roles(items: list[Item], to: str, fused_experts: bool) -> list[Item]:
    """GPT-OSS ships MXFP4 experts and BF16 attention: ``--to mxfp4`` quantizes what upstream does,
    so its other projections become Linear modules kept in source precision."""
    if to != "mxfp4" or not fused_experts:
        return items
    return [replace(it, role=MODULE) if it.role == LINEAR and not it.fused else it for it in items]


def make_plan(src: str, o: ConvertOptions) -> Plan:
    s = open_source(src)
    items = s.family.load("converter")(s.ckpt, s.model, s.where)  # the family's converter: its items in output order
    items = upstream_roles(items, o.to, s.family.fused_experts)
    if o.ignore and not quantizes(o.to):
        raise OptionError("--ignore applies to quantized targets; --to bf16 quantizes nothing")
    keep = ignored(items, o.ignore)
    src_fmt = source_scale_fmt(s.config, s.where)
    scale_fmt = resolve_scale_fmt(o, src_fmt)
    tasks = [decide(it, o, keep, scale_fmt, src_fmt) for it in items]
    shards = plan_shards((spec for t in tasks for spec in t.outputs), o.max_shard_size)
    config = copy.deepcopy(s.config)
    config.pop("quantization_config", None)
    qc = quantization_config(o.to, scale_fmt, tasks)
    if qc:
        config["quantization_config"] = qc
    names = {n for it in items for n in it.source.tensors}
    side = [str(p) for p in s.ckpt.side_files() if p.name != "dtypes.json"]  # dtypes.json belongs to original/
    layout = "original" if _original_names(items) else "root"
    return Plan(str(s.ckpt.root), s.family.name, layout, s.ckpt.fingerprint(), o, scale_fmt, config,
                locations(s.ckpt, names), tasks, shards, side, s.ckpt.skipped_side_files(),
                {f: str((s.ckpt.dir / f).resolve()) for f in s.ckpt.files()})


def _original_names(items: list[Item]) -> bool:
    return any(n.startswith("block.") or n == "embedding.weight" for it in items for n in it.source.tensors)
