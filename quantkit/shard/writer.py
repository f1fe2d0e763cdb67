"""Write a :class:`~quantkit.shard.plan.Plan`: one streamed pass per group file, hard links for the other ranks.

Everything lands in the hidden sibling ``.<DST>.quantkit-partial`` of :class:`CheckpointWriter`
and is renamed onto DST at the end (after ``--verify``, when asked); a failure removes it.  Each
group's tensors are planned with :func:`plan_shards` and streamed with :func:`write_shard` into
the first rank directory of the group, then hard-linked (or, with ``links=False``, copied) into
the others.  Source tensors are read through safetensors' ``get_slice``, so only the piece a file
needs is read and memory stays bounded by the largest piece.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .. import __version__
from ..checkpoint import DTYPES, INDEX, MANIFEST, Checkpoint
from ..progress import Progress
from ..writer import CheckpointWriter, ShardPlan, TensorSpec, plan_shards, sha256_file, write_shard
from .layout import ShardError
from .plan import Group, Piece, Plan

LOADER_NOTE = (
    "Tensor names are global. A TP slice keeps its global name; its rank config lists dim/start/stop and the "
    "global shape under quantkit_shard.splits. Per-expert tensors keep their global expert id in the name. A fused "
    "expert tensor [E_local, ...] holds, at local index i, global expert quantkit_shard.splits[name].experts[i] "
    "(ascending ids; also quantkit_shard.experts[layer]). Route with the full router on every rank, then send each "
    "token to the rank that owns its expert: experts.map[layer][expert] here."
)


class SliceReader:
    """Reads pieces of source tensors through safetensors' lazy slices (one handle per file)."""

    def __init__(self, src: Checkpoint) -> None:
        self.src = src
        self.handles: dict[str, object] = {}

    def _handle(self, name: str):
        from safetensors import safe_open

        fname = self.src.info(name).file
        if fname not in self.handles:
            self.handles[fname] = safe_open(str(self.src.dir / fname), framework="pt")
        return self.handles[fname]

    def read(self, p: Piece) -> torch.Tensor:
        h = self._handle(p.name)
        if p.dim is None:
            return h.get_tensor(p.name)  # type: ignore[attr-defined]
        sl = h.get_slice(p.name)  # type: ignore[attr-defined]
        if p.experts is None:
            return sl[(slice(None),) * p.dim + (slice(p.start, p.stop),)]
        runs = _runs(p.experts)
        parts = [sl[a:b] for a, b in runs]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _runs(ids: tuple[int, ...]) -> list[tuple[int, int]]:
    """Ascending ids -> maximal [a, b) runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for e in ids:
        if runs and runs[-1][1] == e:
            runs[-1] = (runs[-1][0], e + 1)
        else:
            runs.append((e, e + 1))
    return runs


def group_files(g: Group, max_shard_size: int) -> list[tuple[ShardPlan, list[Piece]]]:
    """The group's shard files (``model-<group>-00001-of-00003.safetensors``) with their pieces in order."""
    specs = [TensorSpec(p.name, DTYPES[p.dtype], p.shape) for p in g.pieces]
    plans = plan_shards(specs, max_shard_size)
    by_name = {p.name: p for p in g.pieces}
    for sp in plans:
        sp.file = sp.file.replace("model-", f"model-{g.key}-", 1)
    return [(sp, [by_name[s.name] for s in sp.specs]) for sp in plans]


def _place(src: Path, dst: Path, links: bool) -> None:
    if not links:
        shutil.copy2(src, dst)
        return
    try:
        os.link(src, dst)
    except OSError as e:
        raise ShardError(f"cannot hard-link {src.name} into {dst.parent.name} ({e}): pass --no-hardlinks to copy replicated files") from None


class _Progress:
    def __init__(self, total: int, style: str) -> None:
        self.bar = Progress("shard", total, "B", style)

    def stream(self, pieces: list[Piece], reader: SliceReader) -> Iterator[torch.Tensor]:
        for p in pieces:
            t = reader.read(p)
            n = t.numel() * t.element_size()
            yield t
            del t  # before reading the next piece: one piece alive at a time
            self.bar.update(n)


def write_plan(plan: Plan, w: CheckpointWriter, *, max_shard_size: int, links: bool, progress: str, workers: int = 1) -> dict:
    """Write every rank directory into ``w.tmp``; return the manifest (DST/quantkit.json); ``progress``: a
    :mod:`quantkit.progress` style."""
    par = plan.parallel
    for r in range(par.world):
        (w.tmp / par.rank_dir(r)).mkdir()
    jobs = [(g, sp, pieces) for g in plan.groups for sp, pieces in group_files(g, max_shard_size)]
    bar = _Progress(sum(g.nbytes for g in plan.groups), progress)
    digests = _write_files(plan, w, jobs, bar, workers)
    bar.bar.close()
    files: dict[str, str] = {}
    weight_maps: dict[int, dict[str, str]] = {r: {} for r in range(par.world)}
    totals = dict.fromkeys(range(par.world), 0)
    groups_out: dict[str, dict] = {g.key: {"ranks": list(g.ranks), "files": [], "bytes": g.nbytes} for g in plan.groups}
    for (g, sp, _), digest in zip(jobs, digests):
        first = w.tmp / par.rank_dir(g.ranks[0]) / sp.file
        for r in g.ranks:
            if r != g.ranks[0]:
                _place(first, w.tmp / par.rank_dir(r) / sp.file, links)
            files[f"{par.rank_dir(r)}/{sp.file}"] = digest
            weight_maps[r].update({s.name: sp.file for s in sp.specs})
            totals[r] += sp.nbytes
        groups_out[g.key]["files"].append(sp.file)
    files.update(_side_files(plan, w, links))
    for r in range(par.world):
        rd = par.rank_dir(r)
        w.put_json(f"{rd}/{INDEX}", {"metadata": {"total_size": totals[r]}, "weight_map": dict(sorted(weight_maps[r].items()))})
        w.put_json(f"{rd}/config.json", rank_config(plan, r))
        for name in (INDEX, "config.json"):
            files[f"{rd}/{name}"] = sha256_file(w.tmp / rd / name)
    return manifest(plan, groups_out, files, links)


def _write_files(plan: Plan, w: CheckpointWriter, jobs: list, bar: _Progress, workers: int) -> list[str]:
    """Stream each group file into its group's first rank directory; ``workers`` threads, one file each."""
    local = threading.local()

    def run(job: tuple[Group, ShardPlan, list[Piece]]) -> str:
        g, sp, pieces = job
        if not hasattr(local, "reader"):
            local.reader = SliceReader(plan.src)  # safetensors handles are not shared across threads
        return write_shard(w.tmp / plan.parallel.rank_dir(g.ranks[0]) / sp.file, sp, bar.stream(pieces, local.reader))

    if workers == 1:
        return [run(j) for j in jobs]
    ex = ThreadPoolExecutor(workers)
    try:
        return list(ex.map(run, jobs))  # hashing and file writes release the GIL
    finally:
        ex.shutdown(cancel_futures=True)


def _side_files(plan: Plan, w: CheckpointWriter, links: bool) -> dict[str, str]:
    """Tokenizer and other side files: copied into rank 0, linked (or copied) into the others."""
    par, out = plan.parallel, {}
    for p in plan.src.side_files():
        first = w.tmp / par.rank_dir(0) / p.name
        shutil.copy2(p, first)
        digest = sha256_file(first)
        for r in range(par.world):
            if r:
                _place(first, w.tmp / par.rank_dir(r) / p.name, links)
            out[f"{par.rank_dir(r)}/{p.name}"] = digest
    return out


def rank_config(plan: Plan, rank: int) -> dict:
    """The source config plus ``quantkit_shard``: this rank's coordinates, experts and slices."""
    par, c = plan.parallel, plan.parallel.coords(rank)
    splits = {p.name: d for p in plan.rank_pieces(rank) if (d := p.describe()) is not None}
    return {**plan.src.config, "quantkit_shard": {
        "rank": rank, "world_size": par.world, "ep_size": par.ep, "ep_rank": c.ep, "tp_size": par.tp,
        "tp_rank": c.tp, "dp_size": par.dp, "dp_rank": c.dp, "placement": plan.placement,
        "experts": {str(k): v for k, v in plan.local_experts(rank).items()},
        "splits": dict(sorted(splits.items())),
    }}


def manifest(plan: Plan, groups: dict[str, dict], files: dict[str, str], links: bool) -> dict:
    par = plan.parallel
    return {
        "quantkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "shard",
        "source": {"path": str(plan.src.root), "fingerprint": plan.src.fingerprint(), "family": plan.family},
        "parallel": par.as_dict(),
        "placement": plan.placement,
        "ranks": [{"rank": c.rank, "dir": par.rank_dir(c.rank), "dp_rank": c.dp, "tp_rank": c.tp, "ep_rank": c.ep} for c in par.ranks()],
        "experts": {"n_routed": plan.n_experts, "moe_layers": sorted(plan.expert_map),
                    "map": {str(k): v for k, v in sorted(plan.expert_map.items())}},
        "load": plan.load,
        "replicated_storage": "hardlink" if links else "copy",
        "groups": groups,
        "loader": LOADER_NOTE,
        "files": dict(sorted(files.items())),
    }


def write_manifest(w: CheckpointWriter, m: dict) -> None:
    w.put_json(MANIFEST, m)
