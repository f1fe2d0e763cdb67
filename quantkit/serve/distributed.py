"""Serving the rank directories of ``quantkit shard`` over torch.distributed: the step-by-step driver.

    torchrun --nproc-per-node 4 -m quantkit serve DST        # DST written by quantkit shard --ep 4 [--tp 2]

Rank 0 owns the schedulers (one per DP group, :mod:`.dp`), the sampler and the HTTP server.  Before
each forward it broadcasts the step of every group (the cache sequences released since the last
step, each scheduled sequence's new-token count, the token ids, the logit rows) on a gloo group; the
other ranks replay their group's part on their own KV cache, whose block tables therefore stay
identical to its scheduler's, and take part in the step's collectives.  The layers'
side of it (expert and tensor parallel, the process groups) is :mod:`quantkit.engine.parallel`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ..checkpoint import MANIFEST, CheckpointError
from ..engine.parallel import VocabParallelHead
from ..engine.runner import forward_step
from .request import to_host


def sharded_root(path: str | Path) -> dict | None:
    """The manifest of a ``quantkit shard`` output directory (its ``parallel`` and ``ranks``), else None."""
    m = Path(path) / MANIFEST
    if not m.is_file():
        return None
    man = json.loads(m.read_text())
    return man if "parallel" in man and "ranks" in man else None


def launch_info(root: Path, man: dict) -> tuple[int, int, Path]:
    """(rank, world size, rank directory) of this process, from torchrun's environment."""
    world = man["parallel"]["world_size"]
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world != world:
        raise CheckpointError(f"{root} is a {world}-rank checkpoint written by `quantkit shard`: launch one process per rank, "
                              f"torchrun --nproc-per-node {world} -m quantkit serve {root}  (this launch has {env_world})")
    rank = int(os.environ["RANK"])
    entry = next(r for r in man["ranks"] if r["rank"] == rank)
    return rank, world, root / entry["dir"]


def stop_workers(group) -> None:
    dist.broadcast_object_list([("stop",)], src=0, group=group)


def worker_loop(model, cache, group, rank: int, tp: int) -> int:
    """Ranks > 0: replay rank 0's steps (:class:`.dp.DPEngine`) on this rank's model and its group's cache
    until rank 0 stops; the steps that had tokens of this rank's group.  A failed collective (rank 0 or
    another rank gone, or past the process group's timeout) raises :class:`.dp.RanksLost`."""
    from .dp import RanksLost

    d, leader = rank // tp, rank % tp == 0  # this rank's DP group; its first rank answers rank 0
    head_collective = isinstance(model.lm_head, VocabParallelHead)  # else the group's first rank alone needs logits
    steps = 0
    with torch.no_grad():
        while True:
            box = [None]
            try:
                dist.broadcast_object_list(box, src=0, group=group)
                msg = box[0]
                if msg[0] == "stop":
                    return steps
                if msg[0] == "tick":
                    continue
                if msg[0] == "release":  # no step: the sequences rank 0 released last
                    for sid in msg[1][d]:
                        cache.release(sid)
                    continue
                steps += _replay(model, cache, group, msg[1], d, leader, head_collective)
            except Exception as e:
                raise RanksLost(f"rank {rank}: sharded serving lost rank 0 or another rank (stopped, or past "
                                f"the timeout): {type(e).__name__}: {e}") from e


def _replay(model, cache, group, plans: list, d: int, leader: bool, head_collective: bool) -> int:
    """Run this rank's group's part of a step (the group's first rank sends its logits back when asked);
    1 when the group had tokens, else 0."""
    released, order, tokens, rows, need = plans[d]
    for sid in released:
        cache.release(sid)
    logits = forward_step(model, cache, order, tokens, rows if head_collective or leader else [], [len(p[2]) for p in plans])
    if any(p[3] for p in plans[1:]):  # rank 0 collects the other groups' logits
        dist.gather_object(to_host(logits, need) if leader and d > 0 and rows else None, None, dst=0, group=group)
    return int(bool(order))
