"""Serving the rank directories of ``quantkit shard`` over torch.distributed: the step-by-step driver.

    torchrun --nproc-per-node 4 -m quantkit serve DST        # DST written by quantkit shard --ep 4 [--tp 2]

Rank 0 owns the scheduler, the sampler and the HTTP server.  Before each forward it broadcasts the
step (the cache sequences released since the last step, each scheduled sequence's new-token count,
the token ids and the logit rows) on a gloo group; the other ranks replay it on their own KV cache,
whose block tables therefore stay identical, and take part in the step's collectives.  The layers'
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


def broadcaster(group):
    """Rank 0's ``LLMEngine.on_step``: sends each step to the other ranks."""

    def send(released: list, order: list, tokens: torch.Tensor, rows: list[int]) -> None:
        dist.broadcast_object_list([("step", list(released), order, tokens, rows)], src=0, group=group)

    return send


def stop_workers(group) -> None:
    dist.broadcast_object_list([("stop",)], src=0, group=group)


def worker_loop(model, cache, group) -> int:
    """Ranks > 0: replay rank 0's steps on this rank's model and cache until it stops; the steps run."""
    steps = 0
    head_collective = isinstance(model.lm_head, VocabParallelHead)  # else rank 0 alone needs the logits
    with torch.no_grad():
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0, group=group)
            msg = box[0]
            if msg[0] == "stop":
                return steps
            _, released, order, tokens, rows = msg
            for sid in released:
                cache.release(sid)
            forward_step(model, cache, order, tokens, rows if head_collective else [])
            steps += 1

