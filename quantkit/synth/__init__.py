"""``quantkit synth``: checkpoints in the exact upstream layouts (REFERENCE.md) with random weights.

One module per family builds a :class:`~quantkit.synth.pieces.Synth` (config, tensor pieces,
tokenizer) from a preset's shapes (the family's ``synth`` and ``presets``, :mod:`quantkit.families`); :func:`synthesize` plans the shards from the pieces' specs
and streams them, piece by piece, through :class:`~quantkit.writer.CheckpointWriter`
(atomic; peak memory about two tensors, the one written and the one generated ahead, plus a
16 MB float32 chunk per worker thread).  Same seed, same bytes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .. import families
from ..checkpoint import parse_size
from ..progress import Progress
from ..writer import CheckpointWriter, ShardPlan, plan_shards
from . import presets, tokenizer
from .pieces import Piece, Synth

LAYOUTS = ("root", "original")
SCALE_FMTS = ("float", "ue8m0")
PROGRESS_BYTES = 1 << 28  # progress only for checkpoints that take a while


def plan(family: str, preset: str = "tiny", layers: int | None = None, seed: int = 0,
         layout: str = "root", scale_fmt: str = "float") -> Synth:
    """What ``synthesize`` would write (names, shapes, config), without generating any value."""
    if layout not in LAYOUTS:
        raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if scale_fmt not in SCALE_FMTS:
        raise ValueError(f"--scale-fmt must be one of {', '.join(SCALE_FMTS)}, not {scale_fmt!r}")
    d = presets.dims(family, preset, layers)
    return families.get(family).load("synth")(d, seed, layout, scale_fmt)  # its builder(dims, seed, layout, scale_fmt)


def _shards(synth: Synth, max_shard_size: int) -> list[ShardPlan]:
    plans = plan_shards(synth.specs, max_shard_size)
    if synth.weights_dir:
        for p in plans:  # upstream's original/ folder holds one model.safetensors when it fits
            p.file = f"{synth.weights_dir}/{'model.safetensors' if len(plans) == 1 else p.file}"
    return plans


def _stream(pieces: list[Piece], bar) -> Iterator[torch.Tensor]:
    """The pieces' tensors in plan order; the next piece is generated while this one is written."""
    with ThreadPoolExecutor(max_workers=1) as ahead:
        upcoming = ahead.submit(pieces[0].make) if pieces else None
        for i, piece in enumerate(pieces):
            tensors = upcoming.result()
            upcoming = ahead.submit(pieces[i + 1].make) if i + 1 < len(pieces) else None
            for spec, t in zip(piece.specs, tensors, strict=True):
                yield t
                if bar is not None:
                    bar.update(spec.nbytes)


def _side_files(synth: Synth, folder: Path) -> None:
    tokenizer.write(synth.tokenizer, folder)
    (folder / "generation_config.json").write_text(json.dumps(synth.generation_config, indent=2) + "\n")
    if synth.weights_dir:
        (folder / synth.weights_dir).mkdir(exist_ok=True)
    for rel, obj in synth.extra.items():
        (folder / rel).write_text(json.dumps(obj, indent=2) + "\n")


def synthesize(family: str, dst: str | Path, preset: str = "tiny", layers: int | None = None, seed: int = 0,
               max_shard_size: str | int = "5GB", layout: str = "root", force: bool = False,
               scale_fmt: str = "float", progress: str = "off") -> dict:
    """Write a synthetic checkpoint to ``dst``; return the report (path, sizes, seconds); ``progress``: a
    :mod:`quantkit.progress` style, for checkpoints over PROGRESS_BYTES."""
    t0 = time.perf_counter()
    synth = plan(family, preset, layers, seed, layout, scale_fmt)
    plans = _shards(synth, parse_size(max_shard_size))
    total = sum(p.nbytes for p in plans)
    options = {"family": family, "preset": preset, "layers": synth.config["num_hidden_layers"], "seed": seed,
               "layout": layout, "scale_fmt": scale_fmt}
    w = CheckpointWriter(dst, force=force)
    bar = None
    try:
        _side_files(synth, w.tmp)
        if total > PROGRESS_BYTES:
            bar = Progress("synth", total, "B", progress)
        tensors = _stream(synth.pieces, bar)
        for p in plans:
            w.write(p, tensors)
        w.finish(plans, synth.config, {"command": "synth", "options": options}, weights_dir=synth.weights_dir)
    except BaseException:
        w.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    dt = time.perf_counter() - t0
    return {"path": str(dst), **options, "tensors": len(synth.specs), "files": len(plans), "bytes": total,
            "seconds": round(dt, 3), "mb_per_s": round(total / 1e6 / dt, 1)}
