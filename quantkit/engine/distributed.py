"""Serving the rank directories of ``quantkit shard`` over torch.distributed (expert parallel).

    torchrun --nproc-per-node 4 -m quantkit serve DST        # DST written by quantkit shard --ep 4

Process r loads ``DST/rank-r-of-N``: the replicated weights (attention, norms, routers, dense and
shared-expert MLPs, embedding, LM head) and its share of the routed experts.  Every rank runs every
step on the same batch: attention and dense layers are computed alike on each rank (the DP replicas
of the plan all serve one batch), and each MoE layer runs the router on every rank, computes the
contributions of the experts held locally (a token's slots routed elsewhere get weight zero on this
rank) and sums them over the ranks with one all-reduce, in float32, before the shared expert is
added.

Rank 0 owns the scheduler, the sampler and the HTTP server.  Before each forward it broadcasts the
step (the cache sequences released since the last step, each scheduled sequence's new-token count,
the token ids and the logit rows) on a gloo group; the other ranks replay it on their own KV cache,
whose block tables therefore stay identical, and take part in the step's all-reduces.  NCCL carries
the all-reduces on GPUs, gloo on CPUs (what the tests use).  Tensor parallelism (``--tp`` > 1) is
not served: its attention would need head-sliced layers and TP all-reduces, which are not built.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ..checkpoint import MANIFEST, CheckpointError


class ExpertParallel:
    """A MoE layer's routed experts when each rank holds a subset (``local_ids``, global ids ascending)."""

    def __init__(self, local_ids: list[int], n_global: int, group, device: torch.device) -> None:
        g2l = torch.full((n_global,), -1, dtype=torch.int64)
        g2l[torch.tensor(local_ids, dtype=torch.int64)] = torch.arange(len(local_ids))
        self.g2l, self.group = g2l.to(device), group

    def routed(self, experts, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        local = self.g2l[idx]
        mine = local >= 0
        y = experts(x, torch.where(mine, weights, torch.zeros_like(weights)), torch.where(mine, local, torch.zeros_like(local)))
        y = y.to(torch.float32)
        dist.all_reduce(y, group=self.group)
        return y.to(x.dtype)


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
    if man["parallel"].get("tp", 1) != 1:
        raise CheckpointError(f"{root}: sharded with TP {man['parallel']['tp']}; serving runs expert parallel only (shard with --tp 1)")
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world != world:
        raise CheckpointError(f"{root} is a {world}-rank checkpoint written by `quantkit shard`: launch one process per rank, "
                              f"torchrun --nproc-per-node {world} -m quantkit serve {root}  (this launch has {env_world})")
    rank = int(os.environ["RANK"])
    entry = next(r for r in man["ranks"] if r["rank"] == rank)
    return rank, world, root / entry["dir"]


def init(device: str) -> tuple[torch.device, object]:
    """Join the process group (NCCL on CUDA, gloo on CPU); this rank's device and a gloo control group."""
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None)
    ctrl = dist.new_group(backend="gloo") if dev.type == "cuda" else dist.group.WORLD
    return dev, ctrl


def attach(model, group) -> int:
    """Give every MoE layer of a rank's model its expert-parallel reduction; the number of MoE layers."""
    from .layers.moe import MoE

    shard = model.config["quantkit_shard"]
    n_global = int(next(model.config[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if k in model.config))
    blocks = list(enumerate(model.layers))
    if model.mtp is not None:
        blocks.append((len(model.layers), model.mtp.block))
    n = 0
    for i, layer in blocks:
        if isinstance(layer.mlp, MoE):
            layer.mlp.ep = ExpertParallel(shard["experts"][str(i)], n_global, group, model.device)
            n += 1
    return n


def agree_min(value: int, group) -> int:
    """The smallest of every rank's value (the KV cache size all ranks can hold)."""
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


def broadcaster(group):
    """Rank 0's ``LLMEngine.on_step``: sends each step to the other ranks."""

    def send(released: list, order: list, tokens: torch.Tensor, rows: list[int]) -> None:
        dist.broadcast_object_list([("step", list(released), order, tokens, rows)], src=0, group=group)

    return send


def stop_workers(group) -> None:
    dist.broadcast_object_list([("stop",)], src=0, group=group)


def worker_loop(model, cache, group) -> int:
    """Ranks > 0: replay rank 0's steps on this rank's model and cache until it stops; the steps run."""
    from .scheduler import forward_step

    steps = 0
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
            forward_step(model, cache, order, tokens, rows)
            steps += 1
