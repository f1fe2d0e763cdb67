"""The model side of sharded serving: a rank's layers over torch.distributed (expert and tensor parallel).

Process r of a ``quantkit shard`` output loads ``DST/rank-r-of-N``: its share of the routed experts, its
TP slice of attention, dense / shared-expert MLPs, embedding and LM head (``ModelConfig.local`` gives
its head counts), and the replicated rest.  Every rank runs every step on the same batch:

* tensor parallel, in the TP group (ranks dp * TP .. dp * TP + TP - 1): ``o_proj`` and dense
  ``down_proj`` are row-parallel (:class:`RowParallel`: partial products summed by a float32
  all-reduce, the whole bias added once); the embedding looks up this rank's vocabulary rows and
  sums over the group; the LM head's vocabulary slices are gathered;
* expert parallel, over all ranks: each MoE layer runs the router on every rank, runs the (token,
  slot) pairs routed to its local experts as rows of their own (so a rank's expert work is its own
  pairs only) and sums the contributions with one float32 all-reduce, before the shared expert is
  added.  DP replicas of the plan all serve the one batch.

NCCL carries the collectives on GPUs, gloo on CPUs (what the tests use).  How the ranks are driven
step by step (rank 0 schedules and broadcasts) is the serving side's: :mod:`quantkit.serve.distributed`.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from ..modelconfig import read
from .qlinear import Linear, linear


class ExpertParallel:
    """A MoE layer's routed experts when each rank holds a subset (``local_ids``, global ids ascending)."""

    def __init__(self, local_ids: list[int], n_global: int, group, device: torch.device) -> None:
        g2l = torch.full((n_global,), -1, dtype=torch.int64)
        g2l[torch.tensor(local_ids, dtype=torch.int64)] = torch.arange(len(local_ids))
        self.g2l, self.group = g2l.to(device), group

    def routed(self, experts, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """This rank's (token, slot) pairs whose expert is local run as rows of their own (one slot each,
        so the work is the local pairs only), weighted and summed per token in float32, then over the ranks.

        The experts run with routing weight 1 and the weight is applied here: as in the unsharded
        experts (fused_moe), an expert's output is rounded to x.dtype once and its weighted share stays
        float32 until the sum; a weight applied inside would round every share to x.dtype as well."""
        local = self.g2l[idx]
        tok, slot = torch.where(local >= 0)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if tok.numel():
            ones = torch.ones((tok.numel(), 1), dtype=weights.dtype, device=x.device)
            y = experts(x[tok], ones, local[tok, slot, None])  # [pairs, H] x.dtype: each expert's output, unweighted
            out.index_add_(0, tok, y.to(torch.float32) * weights[tok, slot, None].to(torch.float32))
        dist.all_reduce(out, group=self.group)
        return out.to(x.dtype)


class RowParallel(Linear):
    """A projection whose input features are split over the TP group (``o_proj``, a dense or shared
    expert's ``down_proj``): each rank's partial product in float32, summed by one float32 all-reduce,
    then the bias, which every rank holds whole, once, and one rounding to the output dtype, as the
    whole projection rounds its float32 product once (partials rounded first would add a rounding each)."""

    def __init__(self, inner: Linear, group) -> None:
        super().__init__(inner.weight, None)
        self.register_buffer("whole_bias", inner.bias)
        self.group = group

    def _sum(self, y: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        dist.all_reduce(y, group=self.group)
        if self.whole_bias is not None:
            y = y + self.whole_bias.to(torch.float32)
        return y.to(out_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._sum(linear(x, self.weight, out_dtype=torch.float32), x.dtype)

    def quantized(self, a: torch.Tensor, a_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        return self._sum(super().quantized(a, a_scale, torch.float32), out_dtype)


class VocabParallelHead(nn.Module):
    """The LM head split over the TP group by vocabulary rows: each rank's logits, gathered in rank order."""

    def __init__(self, inner: Linear, group, tp: int) -> None:
        super().__init__()
        self.inner, self.group, self.tp = inner, group, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x).contiguous()
        parts = [torch.empty_like(y) for _ in range(self.tp)]
        dist.all_gather(parts, y, group=self.group)
        return torch.cat(parts, dim=-1)


class VocabParallelEmbedding:
    """Embedding rows [start, stop) on this rank: ids outside give zeros, and the TP group's sum is the lookup."""

    def __init__(self, start: int, stop: int, group) -> None:
        self.start, self.stop, self.group = start, stop, group

    def __call__(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        mine = (ids >= self.start) & (ids < self.stop)
        x = table[torch.where(mine, ids - self.start, torch.zeros_like(ids))] * mine[:, None].to(table.dtype)
        out = x.to(torch.float32)
        dist.all_reduce(out, group=self.group)
        return out.to(table.dtype)


def tp_groups(world: int, tp: int):
    """This rank's TP group (ranks dp * tp .. dp * tp + tp - 1); every rank creates every group, in order."""
    mine = None
    for d in range(world // tp):
        g = dist.new_group(list(range(d * tp, (d + 1) * tp)))
        if dist.get_rank() // tp == d:
            mine = g
    return mine


def attach_tp(model, group) -> int:
    """Wrap a TP rank's row-parallel projections, LM head and embedding; the number of projections wrapped."""
    from .layers.mlp import MLP

    shard = model.config["quantkit_shard"]
    tp = int(shard["tp_size"])
    n = 0
    for mod in list(model.modules()):
        if hasattr(mod, "o_proj") and isinstance(mod.o_proj, Linear) and not isinstance(mod.o_proj, RowParallel):
            mod.o_proj, n = RowParallel(mod.o_proj, group), n + 1
        if isinstance(mod, MLP) and not isinstance(mod.down_proj, RowParallel):
            mod.down_proj, n = RowParallel(mod.down_proj, group), n + 1
    split = shard["splits"].get("model.embed_tokens.weight")
    if split is not None:
        model.embed_parallel = VocabParallelEmbedding(split["start"], split["stop"], group)
    tied = "lm_head.weight" not in shard["splits"] and split is not None and model.config.get("tie_word_embeddings")
    if "lm_head.weight" in shard["splits"] or tied:  # the head (or the embedding it is tied to) holds this rank's vocabulary rows
        model.lm_head = VocabParallelHead(model.lm_head, group, tp)
    return n


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


def attach(model) -> int:
    """Give every MoE layer of a rank's model its expert-parallel reduction over all ranks; the number of MoE layers."""
    from .layers.moe import MoE

    blocks = list(enumerate(model.layers))
    if model.mtp is not None:
        blocks.append((len(model.layers), model.mtp.block))
    moe = [(i, layer.mlp) for i, layer in blocks if isinstance(layer.mlp, MoE)]
    if not moe:  # a dense model (Qwen3): tensor parallel only
        return 0
    shard = model.config["quantkit_shard"]
    n_global = read(model.config).experts
    for i, mlp in moe:
        mlp.ep = ExpertParallel(shard["experts"][str(i)], n_global, None, model.device)  # None: the world group
    return len(moe)


def agree_min(value: int, group) -> int:
    """The smallest of every rank's value (the KV cache size all ranks can hold)."""
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())
