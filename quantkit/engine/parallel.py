"""The model side of sharded serving: a rank's layers over torch.distributed (expert and tensor parallel).

Process r of a ``quantkit shard`` output loads ``DST/rank-r-of-N``: its share of the routed experts, its
TP slice of attention, dense / shared-expert MLPs, embedding and LM head (``ModelConfig.local`` gives
its head counts), and the replicated rest.  Every rank of a TP group runs the same batch:

* tensor parallel, in the TP group (ranks dp * TP .. dp * TP + TP - 1): ``o_proj`` and dense
  ``down_proj`` are row-parallel (:class:`RowParallel`: partial products summed by a float32
  all-reduce, the whole bias added once); the embedding looks up this rank's vocabulary rows and
  sums over the group; the LM head's vocabulary slices are gathered;
* expert parallel, over all ranks: each MoE layer runs the router on every rank, runs the (token,
  slot) pairs routed to its local experts as rows of their own (so a rank's expert work is its own
  pairs only) and sums the contributions with one float32 all-reduce, before the shared expert is
  added.

With DP groups (DP = world / TP > 1) each group runs its own requests through attention and the dense
layers, and every MoE layer exchanges tokens over all ranks (:class:`DPExchange`: an all-gather of the
groups' tokens before the experts, a reduce-scatter after); a group without tokens in a step still
enters each exchange (:func:`idle_step`).

NCCL carries the collectives on GPUs, gloo on CPUs (what the tests use).  How the ranks are driven
step by step (rank 0 schedules and broadcasts) is the serving side's: :mod:`quantkit.serve.distributed`.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch import nn

from ..modelconfig import read
from .qlinear import Linear, linear

# one collective under its torch 2.13 name (the H200 image's 2.11 has only the older one)
_all_gather_1 = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_1 = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ExpertParallel:
    """A MoE layer's routed experts when each rank holds a subset (``local_ids``, global ids ascending)."""

    def __init__(self, local_ids: list[int], n_global: int, group, device: torch.device) -> None:
        g2l = torch.full((n_global,), -1, dtype=torch.int64)
        g2l[torch.tensor(local_ids, dtype=torch.int64)] = torch.arange(len(local_ids))
        self.g2l, self.group = g2l.to(device), group
        self.dp: DPExchange | None = None  # DP groups: every group's tokens are gathered around the experts

    def routed(self, experts, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """This rank's (token, slot) pairs whose expert is local run as rows of their own (one slot each,
        so the work is the local pairs only), weighted and summed per token in float32, then over the ranks.
        With DP groups (``dp``) the pairs are those of every group's tokens, gathered first and scattered
        back after.

        The experts run with routing weight 1 and the weight is applied here: as in the unsharded
        experts (fused_moe), an expert's output is rounded to x.dtype once and its weighted share stays
        float32 until the sum; a weight applied inside would round every share to x.dtype as well."""
        n = x.shape[0]
        if self.dp is not None:
            x_all, weights, idx, rows = self.dp.gather(x, weights, idx)
        else:
            x_all = x
        local = self.g2l[idx]
        tok, slot = torch.where(local >= 0)
        out = torch.zeros(x_all.shape, dtype=torch.float32, device=x.device)
        if tok.numel():
            ones = torch.ones((tok.numel(), 1), dtype=weights.dtype, device=x.device)
            y = experts(x_all[tok], ones, local[tok, slot, None])  # [pairs, H] x.dtype: each expert's output, unweighted
            out.index_add_(0, tok, y.to(torch.float32) * weights[tok, slot, None].to(torch.float32))
        if self.dp is not None:
            return self.dp.combine(out, rows, n).to(x.dtype)
        dist.all_reduce(out, group=self.group)
        return out.to(x.dtype)


class DPExchange:
    """The MoE layers' token exchange when each DP group of ``tp`` ranks runs its own requests.

    The step's token count of every group (``begin``: rank 0 sends them with the step, so no collective
    asks) sets a chunk c = ceil(max count / tp).  Rank t of group d takes rows [t c, (t + 1) c) of its
    group's tokens (zero-padded): the TP ranks of a group hold the same hidden states, so each sends a
    different share and every token travels once.  ``gather`` all-gathers the chunks (hidden states in
    the model dtype, routing weights and expert ids as float32, exact below 2^24 experts) over all
    ranks and keeps the real rows; after the local experts ``combine`` reduce-scatters the float32 sums
    (rank r gets chunk r summed over every rank's experts) and all-gathers the chunks inside the TP
    group, so each rank ends with its own group's tokens, combined with every rank's experts."""

    def __init__(self, dp: int, tp: int, tp_group) -> None:
        self.dp, self.tp, self.tp_group = dp, tp, tp_group
        self.rank = dist.get_rank()
        self.sizes = [0] * dp
        self.rows: torch.Tensor | None = None

    def begin(self, sizes: list[int]) -> None:
        if len(sizes) != self.dp:
            raise ValueError(f"a step of {self.dp} DP groups needs {self.dp} token counts, got {len(sizes)}")
        self.sizes = [int(n) for n in sizes]
        self.rows = None  # made by the step's first MoE layer, on the device

    @property
    def chunk(self) -> int:
        return max(1, -(-max(self.sizes) // self.tp))  # at least one row: every rank sends a chunk of one shape

    def _rows(self, device: torch.device) -> torch.Tensor:
        """Rows of the gathered [world * c] buffer that hold tokens (the rest is padding)."""
        c, parts = self.chunk, []
        for r in range(self.dp * self.tp):
            d, t = divmod(r, self.tp)
            parts.append(torch.arange(max(0, min(c, self.sizes[d] - t * c))) + r * c)
        return torch.cat(parts).to(device)

    def gather(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every group's tokens (x, routing weights, expert ids) and the rows they came from."""
        if x.shape[0] != self.sizes[self.rank // self.tp]:
            raise ValueError(f"rank {self.rank}: {x.shape[0]} tokens in an MoE layer, the step said {self.sizes}")
        c, k, world = self.chunk, idx.shape[1], self.dp * self.tp
        start = (self.rank % self.tp) * c
        n = max(0, min(c, x.shape[0] - start))
        xs = torch.zeros(c, x.shape[1], dtype=x.dtype, device=x.device)  # [c, H] this rank's share, padded
        rs = torch.zeros(c, 2 * k, dtype=torch.float32, device=x.device)  # [c, 2k] weights | expert ids
        xs[:n], rs[:n, :k], rs[:n, k:] = x[start:start + n], weights[start:start + n], idx[start:start + n].to(torch.float32)
        x_all = torch.empty(world * c, x.shape[1], dtype=x.dtype, device=x.device)
        r_all = torch.empty(world * c, 2 * k, dtype=torch.float32, device=x.device)
        _all_gather_1(x_all, xs)
        _all_gather_1(r_all, rs)
        if self.rows is None:
            self.rows = self._rows(x.device)
        rows = self.rows
        r_all = r_all[rows]
        return x_all[rows], r_all[:, :k], r_all[:, k:].to(torch.int64), rows

    def combine(self, out: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
        """float32 expert sums of the gathered tokens [len(rows), H] -> this rank's group's n tokens [n, H]."""
        c, world = self.chunk, self.dp * self.tp
        buf = torch.zeros(world * c, out.shape[1], dtype=torch.float32, device=out.device)
        buf[rows] = out
        mine = torch.empty(c, out.shape[1], dtype=torch.float32, device=out.device)
        _reduce_scatter_1(mine, buf)
        if self.tp > 1:
            group = torch.empty(self.tp * c, out.shape[1], dtype=torch.float32, device=out.device)
            _all_gather_1(group, mine, group=self.tp_group)
            mine = group
        return mine[:n]


def idle_step(model, sizes: list[int]) -> None:
    """A DP group with no tokens this step: it enters every MoE layer's exchange with zero tokens, in
    layer order, as the groups with work do (attention and dense layers have no rows to run, and their
    collectives stay inside the group, whose ranks all skip them)."""
    from .layers.moe import MoE

    model.dp_exchange.begin(sizes)  # the caller's rule: only a model with MoE layers has an exchange
    h = model.embed_tokens.shape[1]
    with torch.no_grad():
        for layer in model.layers:
            mlp = layer.mlp
            if isinstance(mlp, MoE):
                k = mlp.router.routing.top_k
                x = torch.zeros(0, h, dtype=model.dtype, device=model.device)
                mlp.ep.routed(mlp.experts, x, torch.zeros(0, k, device=model.device),
                              torch.zeros(0, k, dtype=torch.int64, device=model.device))


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


def init(device: str, timeout_s: float = 300.0) -> tuple[torch.device, object]:
    """Join the process group (NCCL on CUDA, gloo on CPU); this rank's device and a gloo control group.
    ``timeout_s`` bounds every collective's wait: a rank that died or hangs fails the others' next one."""
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None,
                                timeout=timeout)
    ctrl = dist.new_group(backend="gloo", timeout=timeout) if dev.type == "cuda" else dist.group.WORLD
    return dev, ctrl


def attach(model, dp: int = 1, tp: int = 1, tp_group=None, exchange: str = "all-reduce", max_num_seqs: int = 64) -> int:
    """Give every MoE layer of a rank's model its expert-parallel exchange over all ranks (with ``dp`` > 1
    groups, the token exchange of :class:`DPExchange`, also ``model.dp_exchange``; with ``exchange``
    "all-to-all", :mod:`.ep_exchange`'s dispatch and combine, its decode capacity from ``max_num_seqs``);
    the number of MoE layers."""
    from .layers.moe import MoE

    blocks = list(enumerate(model.layers))
    if model.mtp is not None:
        blocks.append((len(model.layers), model.mtp.block))
    moe = [(i, layer.mlp) for i, layer in blocks if isinstance(layer.mlp, MoE)]
    if not moe:  # a dense model (Qwen3): tensor parallel only
        return 0
    shard = model.config["quantkit_shard"]
    n_global = read(model.config).experts
    if exchange == "all-to-all":
        from .ep_exchange import attach_all_to_all

        model.dp_exchange = attach_all_to_all(moe, shard["experts"], n_global, tp, tp_group, max_num_seqs)
        return len(moe)
    if exchange != "all-reduce":
        raise ValueError(f"expert exchange must be all-reduce or all-to-all, not {exchange!r}")
    exchange = DPExchange(dp, tp, tp_group) if dp > 1 else None
    model.dp_exchange = exchange
    for i, mlp in moe:
        mlp.ep = ExpertParallel(shard["experts"][str(i)], n_global, None, model.device)  # None: the world group
        mlp.ep.dp = exchange
    return len(moe)


def agree_min(value: int, group) -> int:
    """The smallest of every rank's value (the KV cache size all ranks can hold)."""
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())
