"""``quantkit convert``: requantize a checkpoint into fp8-block, mxfp8 or bf16, streaming, atomic, verified.

One module per family (gpt_oss, deepseek, qwen3; the family's ``converter``, :mod:`quantkit.families`) turns the
source's tensors into conversion items (rename tables as data, the few real transforms as code); :mod:`plan` decides every output tensor
and its path from the headers alone; :mod:`engine` streams the shards (in worker processes when
asked) through :class:`~quantkit.writer.CheckpointWriter`; :mod:`targets` does the numerics
with the formats/ reference (or quantkit.kernels on CUDA).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .. import destination
from ..checkpoint import CheckpointError
from ..writer import CheckpointWriter
from .engine import FIDELITY_DIR, execute, load_fidelity
from .memory import RssSampler
from .options import ConvertOptions, OptionError
from .plan import Plan, make_plan
from .provenance import FILE_HASH, SourceHashes
from .report import dry_report, run_report

__all__ = ["ConvertOptions", "OptionError", "Plan", "convert", "make_plan"]


def check_paths(src: Path, dst: Path) -> None:
    s, d = src.resolve(), dst.resolve()
    if d == s or s in d.parents or d in s.parents:
        raise CheckpointError(f"{dst}: the destination may not be the source, inside it, or contain it")


def manifest(plan: Plan, fidelity: dict[str, dict], digests: dict[str, str]) -> dict:
    return {
        "command": "convert",
        "source": {"path": plan.src, "family": plan.family, "layout": plan.layout, "fingerprint": plan.fingerprint,
                   "file_hash": FILE_HASH, "files": digests},
        "options": plan.recorded_options(),
        "tensors": fidelity,
    }


def finish(plan: Plan, writer: CheckpointWriter, digests: dict[str, str]) -> dict[str, dict]:
    fidelity = load_fidelity(plan, writer.tmp)
    shutil.rmtree(writer.tmp / FIDELITY_DIR)
    for p in plan.side_files:
        shutil.copy2(p, writer.tmp / Path(p).name)
    writer.finish(plan.shards, plan.config, manifest(plan, fidelity, digests))
    return fidelity


def convert(src: str | Path, dst: str | Path, options: ConvertOptions, progress: Callable[[int], None] | None = None,
            start: Callable[[int], None] | None = None) -> dict:
    """Convert ``src`` into ``dst``; return the report (also what ``--json`` prints).

    ``start`` is called once with the output's tensor bytes, ``progress`` with the byte count of
    each output tensor as it is written (shards kept by --resume count at once)."""
    t0 = time.perf_counter()
    check_paths(Path(src), Path(dst))
    plan = make_plan(str(src), options)
    if options.dry_run:
        return dry_report(plan, str(dst))
    hashes = SourceHashes(plan)  # hashing runs in background threads while the shards are converted
    try:
        writer = _writer(dst, plan, options, hashes)
        try:
            kept = len(writer.done)
            if start is not None:
                start(sum(s.nbytes for s in plan.shards))
            results, fidelity, peak = _run(plan, writer, hashes, progress or (lambda n: None))
        finally:
            writer.close()
    finally:
        hashes.close()
    rep = run_report(plan, str(dst), fidelity, results, kept, time.perf_counter() - t0, peak)
    rep["run"]["shards_redone_source_changed"] = writer.stale
    rep["run"]["shards_redone_other_hash_scheme"] = writer.other_scheme
    return rep


def _writer(dst: str | Path, plan: Plan, options: ConvertOptions, hashes: SourceHashes) -> CheckpointWriter:
    try:
        return CheckpointWriter(dst, force=options.force, resume=options.resume, job=plan.job(), command="convert", sources=hashes,
                                file_hash=FILE_HASH)
    except OSError as e:
        if destination.disk_full(e):
            needed = sum(s.nbytes for s in plan.shards)
            raise CheckpointError(destination.disk_full_message(Path(dst).absolute().parent, needed, None)) from None
        raise


def _run(plan: Plan, writer: CheckpointWriter, hashes: SourceHashes, progress: Callable[[int], None]) -> tuple[list, dict[str, dict], int]:
    progress(sum(s.nbytes for s in plan.shards if writer.is_done(s.file)))
    try:
        with RssSampler() as rss:
            results = execute(plan, writer, progress)
            fidelity = finish(plan, writer, hashes.digests())
    except (CheckpointError, OptionError):
        writer.abort()  # an input error: nothing to resume, leave nothing behind
        raise
    except OSError as e:
        if not destination.disk_full(e):
            raise
        left = sum(s.nbytes for s in plan.shards if not writer.is_done(s.file))
        raise CheckpointError(destination.disk_full_message(writer.tmp.parent, left, writer.tmp)) from None
    return results, fidelity, rss.peak
