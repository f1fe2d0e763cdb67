"""``quantkit shard``: plan, write (atomically), optionally verify, and report."""

from __future__ import annotations

import time
from pathlib import Path

from .. import destination
from ..checkpoint import Checkpoint, parse_size
from ..writer import CheckpointWriter
from .layout import Parallel, ShardError
from .plan import Plan, build
from .verify import verify
from .writer import write_manifest, write_plan

DEFAULT_MAX_SHARD = "5GB"


def shard(
    src: str | Path,
    dst: str | Path,
    *,
    ep: int,
    tp: int = 1,
    dp: int | None = None,
    placement: str = "contiguous",
    expert_load: str | Path | None = None,
    verify_output: bool = False,
    force: bool = False,
    dry_run: bool = False,
    hardlinks: bool = True,
    max_shard_size: str | int = DEFAULT_MAX_SHARD,
    progress: str = "off",
    workers: int = 1,
) -> dict:
    """Split SRC into DST/rank-XXXXX-of-NNNNN/ directories plus DST/quantkit.json; return the report."""
    src_p, dst_p, shard_bytes = _check_args(src, dst, force, workers, max_shard_size)
    ckpt = Checkpoint(src_p)
    plan = build(ckpt, Parallel.make(ep, tp, dp), placement, str(expert_load) if expert_load else None)
    report = summary(plan, dst_p)
    if dry_run:
        return {**report, "dry_run": True}
    options = {"ep": ep, "tp": tp, "dp": dp, "placement": placement, "expert_load": str(expert_load) if expert_load else None,
               "max_shard_size": max_shard_size, "hardlinks": hardlinks}
    t0 = time.perf_counter()
    try:
        w = CheckpointWriter(dst_p, force=force, command="shard")
    except OSError as e:
        if destination.disk_full(e):
            raise ShardError(destination.disk_full_message(dst_p.parent, report["bytes_written"], None)) from None
        raise
    try:
        man = write_plan(plan, w, max_shard_size=shard_bytes, links=hardlinks, progress=progress, workers=workers)
        write_manifest(w, {**man, "options": options})
        seconds = time.perf_counter() - t0
        checked = verify(w.tmp, ckpt) if verify_output else None
        w.commit()
    except BaseException as e:
        w.abort()  # shard has no --resume: a failed run leaves nothing
        if destination.disk_full(e):
            raise ShardError(destination.disk_full_message(w.tmp.parent, report["bytes_written"], None)) from None
        raise
    if checked is not None:
        checked["seconds"] = round(time.perf_counter() - t0 - seconds, 3)
    return {**report, "dry_run": False, "seconds": round(seconds, 3),
            "gb_per_s": round(report["bytes_written"] / seconds / 1e9, 3) if seconds > 0 else None, "verify": checked}


def _check_args(src: str | Path, dst: str | Path, force: bool, workers: int, max_shard_size: str | int) -> tuple[Path, Path, int]:
    src_p, dst_p = Path(src).resolve(), destination.named(dst)  # DST as named: a symlink DST is replaced, never written through
    real = dst_p.parent.resolve() / dst_p.name
    if real == src_p or src_p in real.parents or real in src_p.parents or dst_p.resolve() == src_p:
        raise ShardError(f"{dst}: DST must not be SRC, inside it, or contain it")
    if destination.occupied(dst_p) and not force:
        raise ShardError(f"{dst} already exists: pass --force to replace it (it is {destination.kind(dst_p)})")
    if workers < 1:
        raise ShardError(f"--workers must be at least 1, got {workers}")
    try:
        return src_p, dst_p, parse_size(max_shard_size)
    except ValueError as e:
        raise ShardError(f"--max-shard-size: {e}") from None


def summary(plan: Plan, dst: Path) -> dict:
    """What the plan writes: sizes per rank, bytes written once vs. held by all ranks, expert load."""
    par = plan.parallel
    per_rank = [sum(g.nbytes for g in plan.groups if r in g.ranks) for r in range(par.world)]
    return {
        "src": str(plan.src.root), "dst": str(dst), "family": plan.family, **par.as_dict(),
        "placement": plan.placement, "moe_layers": len(plan.expert_map), "n_routed_experts": plan.n_experts,
        "source_bytes": plan.src.total_bytes(),
        "bytes_written": sum(g.nbytes for g in plan.groups),  # each group file once
        "bytes_held": sum(per_rank),  # what the ranks hold together (links counted per rank)
        "max_rank_bytes": max(per_rank),
        "groups": {g.key: {"ranks": len(g.ranks), "tensors": len(g.pieces), "bytes": g.nbytes} for g in plan.groups},
        "load": None if plan.load is None else {k: v for k, v in plan.load.items() if k.startswith("max_over_mean")},
        "side_files_skipped": plan.src.skipped_side_files(),
    }
