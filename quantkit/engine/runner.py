"""The one door between serving and the model: a scheduled step in, logits out.

The scheduler (:mod:`quantkit.serve.scheduler`) decides which sequences run and how many tokens each
adds; :func:`forward_step` allocates their cache slots and runs the model eagerly, and
:class:`ModelRunner` adds CUDA graphs for decode steps (vLLM's and nano-vllm's design):

* a decode step (every sequence adds one token) of B sequences replays the graph captured for the
  smallest batch-size bucket >= B (1, 2, 4, 8, then every 16 up to ``max_num_seqs``); the rows past B are
  padding: token 0 at position 0, writing its keys to a scratch cache block that no sequence owns;
* the graph reads static device buffers: token ids, positions, cache slots and context lengths (one
  int64 buffer, one host-to-device copy from pinned memory per step) and the block tables (a second
  copy, as wide as the step's widest table rounded up to 16 blocks, staged incrementally:
  :class:`StagedTables`); the step's metadata is made on the host from plain ints
  (:meth:`KVCache.schedule_decode`), nothing in the forward waits for the host;
* the graph ends in the LM head in the compute dtype and the argmax of every row, so a greedy batch
  moves B ids to the host (the one synchronisation of a step) and float32 logits exist only for the
  rows a sampler reads (:func:`quantkit.serve.sampling.sample_rows`, on the device).

Prefill chunks, steps mixing them with decodes, sharded ranks and models whose layers wait for the host
(the per-expert MoE loop of unquantized or MXFP4 experts) run eagerly; ``enforce_eager`` runs every step so.
Graphed steps run the Triton MLA decode (FlashInfer's MLA wrapper plans on the host per step).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from .batch import AttnMeta, Batch
from .model import CausalLM
from .parallel import idle_step


def forward_step(model: CausalLM, cache, order: list[tuple[Hashable, int]], tokens: torch.Tensor, rows: list[int],
                 group_sizes: list[int] | None = None) -> torch.Tensor | None:
    """Allocate the step's cache slots and run the model: logits float32 [len(rows), V] on the model's
    device, or None when no row is wanted (prefill chunks only: their keys and values go to the cache).

    ``group_sizes``: with DP groups, every group's token count this step (the MoE layers' exchange needs
    them); a group with an empty ``order`` then only joins the exchange."""
    if group_sizes is not None and model.dp_exchange is not None:  # a dense model's groups never meet
        if not order:
            idle_step(model, group_sizes)
            return None
        model.dp_exchange.begin(group_sizes)
    if not order:
        return None
    batch = cache.schedule(dict(order))
    tokens = torch.as_tensor(tokens).to(model.device)
    if rows:
        return model(tokens, batch.positions, cache, batch, rows=rows)
    model.hidden(tokens, batch.positions, cache, batch)
    return None


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes a graph is captured for: 1, 2, 4, 8, then every 16, and ``max_num_seqs`` itself."""
    out = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return out + [max_num_seqs]


def eager_reason(model: CausalLM, cache) -> str | None:
    """Why decode steps of this model cannot be captured in CUDA graphs, or None when they can."""
    if model.device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the model is on {model.device.type}"
    if "quantkit_shard" in model.config or model.dp_exchange is not None or model.embed_parallel is not None:
        return "sharded serving runs eagerly (its collectives are not captured)"
    if not cache.layers:
        return "this cache holds block tables only (another DP group's)"
    from .layers.moe import MoE

    for m in model.modules():
        if isinstance(m, MoE) and (m.experts.fused is None or m.ep is not None):
            return f"the MoE layers run {m.experts.path if m.ep is None else 'expert parallel'}: they wait for the host"
    return None


class StagedTables:
    """The decode batch's block tables in pinned staging memory [n, stride], kept from step to step: a table that
    grew writes its new blocks alone (a decode step adds a block to a sequence once every ``block_size`` steps),
    rows whose sequences moved up (the ones before them left the batch) move in runs, one copy each, and only a
    sequence new to the batch is written whole.  Converting every entry from Python ints each step took 1.2 ms
    a step at 256 sequences of 36 blocks (quantkit bench host-overhead).

    The stride is the widest table rounded up to ``CHUNK`` columns, so the layout changes rarely; entries past a
    sequence's blocks hold the scratch block.  Each step copies the staged rows to the device tables' first
    ``stride`` columns."""

    CHUNK = 16

    def __init__(self, stage: torch.Tensor, tables: torch.Tensor, scratch: int) -> None:
        """``stage``: pinned int64 [rows * width] (flat: a step's rows are contiguous at its stride); ``tables``:
        the device's int64 [rows, width]."""
        self.stage, self.np = stage, stage.numpy()  # numpy view of the pinned buffer: slice writes without torch ops
        self.tables, self.width, self.scratch = tables, tables.shape[1], scratch
        self.stride = 0
        self.copy: tuple[tuple[int, int], torch.Tensor, torch.Tensor] | None = None  # the last (n, stride): its views
        self.rows: list[list[int]] = []  # the table list written in each row (the cache's own, which only grows)
        self.written: list[int] = []  # and how many of its blocks

    def update(self, tables: list[list[int]]) -> None:
        """Write the step's tables and copy them to the device (``non_blocking``: the caller waits for the copy
        before the next update)."""
        n, lens = len(tables), [len(t) for t in tables]
        s = min(-(-max(lens) // self.CHUNK) * self.CHUNK, self.width)
        # the same tables in the same rows (most steps; list == is an identity check per row here, and where two
        # lists are equal the row holds the right blocks all the same: a table only grows)
        written = self.written if s == self.stride and self.rows == tables else self._place(tables, s)
        buf = self.np
        for i in [i for i, (k, done) in enumerate(zip(lens, written)) if k > done]:
            buf[i * s + written[i] : i * s + lens[i]] = tables[i][written[i]:]
        self.stride, self.rows, self.written = s, list(tables), lens
        if self.copy is None or self.copy[0] != (n, s):  # views made once while the shape holds (a torch op is ~1 us)
            self.copy = ((n, s), self.stage[: n * s].view(n, s), self.tables[:n, :s])
        _, src, dst = self.copy
        dst.copy_(src, non_blocking=True)

    def _place(self, tables: list[list[int]], s: int) -> list[int]:
        """Move the rows that moved up (the sequences before them left), a run of consecutive rows per copy; set
        the other new rows to scratch.  Per row, how many of its table's blocks it now holds."""
        old = self.rows if s == self.stride else []
        src = [i if i < len(old) and old[i] is t else -1 for i, t in enumerate(tables)]
        if old and -1 in src:
            at = {id(t): j for j, t in enumerate(old)}  # old holds its lists alive: an id is one of them or none
            for i, t in enumerate(tables):
                if src[i] < 0 and at.get(id(t), -1) > i:  # a row below: the moves run top down, it is intact
                    src[i] = at[id(t)]
        buf, n, i = self.np, len(tables), 0
        while i < n:
            j, m = src[i], 1
            if j > i:
                while i + m < n and src[i + m] == j + m:
                    m += 1
                buf[i * s : (i + m) * s] = buf[j * s : (j + m) * s]
            elif j < 0:
                buf[i * s : (i + 1) * s] = self.scratch
            i += m
        return [self.written[j] if j >= 0 else 0 for j in src]


@dataclass
class GraphReport:
    buckets: list[int]
    seconds: float  # capture time, warm-up runs included
    bytes: int  # device memory the capture took: static buffers, the graphs' pool, the warm-up's cached blocks

    def __str__(self) -> str:
        sizes = ",".join(map(str, self.buckets))
        return f"CUDA graphs for decode batches of {sizes}: captured in {self.seconds:.1f} s, {self.bytes / 2**20:.0f} MiB"


class ModelRunner:
    """Runs the scheduler's steps: CUDA-graph replays for decode steps, :func:`forward_step` otherwise.

    :meth:`run` returns (logits in the compute dtype [len(rows), V], argmax ids [len(rows)]) on the device,
    or (None, None) when no row is wanted."""

    def __init__(self, model: CausalLM, cache, max_num_seqs: int, max_model_len: int, enforce_eager: bool = False,
                 static: bool = False) -> None:
        """``static``: decode steps take the graphs' path (static buffers, padded buckets, scratch block) but run it
        eagerly, on any device: what the CPU tests check the graphed step's data path with."""
        self.model, self.cache, self.static = model, cache, static
        self.why_eager = "enforce_eager" if enforce_eager else None if static else eager_reason(model, cache)
        self.buckets = [] if self.why_eager else graph_buckets(max_num_seqs)
        self.width = -(-max_model_len // cache.block_size)  # block-table columns a sequence can use
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict]] = {}
        self.report: GraphReport | None = None
        self.replays = 0
        self.scratch = cache.reserve_block() if self.buckets else None  # where padding rows write their keys

    @property
    def graphed(self) -> bool:
        return bool(self.buckets) and not self.static

    # --- capture ---------------------------------------------------------------------------------
    def capture(self) -> GraphReport | None:
        """Capture every bucket's graph (largest first, one memory pool); idempotent.  None when eager."""
        if not self.buckets or self.report is not None:
            return self.report
        dev, top, bs = self.model.device, self.buckets[-1], self.cache.block_size
        cuda = dev.type == "cuda"
        if cuda:  # what is free before: without memory a dropped engine or cached blocks still hold (they would go mid-capture)
            gc.collect()
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
        free0 = torch.cuda.mem_get_info(dev)[0] if cuda else 0
        t0 = time.perf_counter()
        pad_slot = self.scratch * bs
        # per bucket b the head buffer holds [ids b | positions b | slots b | context lens b]
        self.head = torch.zeros(4 * top, dtype=torch.int64, device=dev)
        self.stage = torch.zeros(4 * top, dtype=torch.int64, pin_memory=cuda)
        self.tables = torch.full((top, self.width), self.scratch, dtype=torch.int64, device=dev)
        self.stage_np = self.stage.numpy()  # the pinned buffer written through numpy: no tensor made per step
        self.heads = {b: (self.head[: 4 * b], self.stage[: 4 * b]) for b in self.buckets}  # each bucket's views, made once
        self.staged = StagedTables(torch.zeros(top * self.width, dtype=torch.int64, pin_memory=cuda), self.tables, self.scratch)
        self.cu = torch.arange(top + 1, dtype=torch.int32, device=dev)
        self.copied = torch.cuda.Event() if cuda else None
        if self.static:
            self.report = GraphReport([], time.perf_counter() - t0, 0)
            return self.report
        pool = None
        with torch.no_grad(), torch.cuda.device(dev):  # the graphs and their pool on the model's GPU (cuda:N too)
            for b in reversed(self.buckets):
                self.head[: 4 * b].copy_(torch.tensor([0] * 2 * b + [pad_slot] * b + [1] * b))
                self._forward(b)  # warm-up: compiles, autotunes and grows workspaces outside the capture
                torch.cuda.synchronize(dev)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool):
                    out = self._forward(b)
                pool = g.pool()
                self.graphs[b] = (g, out)
        torch.cuda.synchronize(dev)
        self.report = GraphReport(list(self.buckets), time.perf_counter() - t0, free0 - torch.cuda.mem_get_info(dev)[0])
        return self.report

    def _forward(self, b: int) -> dict[str, torch.Tensor]:
        """The decode forward of bucket b on the static buffers (what each graph records)."""
        h = self.head
        ids, pos, slots, ctx = h[:b], h[b : 2 * b], h[2 * b : 3 * b], h[3 * b : 4 * b]
        ctx32 = ctx.to(torch.int32)
        meta = AttnMeta(self.cu[: b + 1], self.cu[: b + 1], ctx32, 1, True)
        batch = Batch(tuple(range(b + 1)), pos, slots, self.tables[:b], None, self.cache.block_size, meta=meta)
        logits = self.model.lm_head(self.model.hidden(ids, None, self.cache, batch))
        return {"logits": logits, "top": logits.argmax(-1)}

    # --- steps -----------------------------------------------------------------------------------
    def run(self, order: list[tuple[Hashable, int]], tokens: list[int] | torch.Tensor, rows: list[int]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.buckets and order and len(order) <= self.buckets[-1] and all(n == 1 for _, n in order):
            return self._replay(order, tokens, rows)
        logits = forward_step(self.model, self.cache, order, tokens, rows)
        return (None, None) if logits is None else (logits, logits.argmax(-1))

    def bucket(self, n: int) -> int:
        """The batch size of the graph a decode step of n sequences replays."""
        return next(b for b in self.buckets if b >= n)

    def _replay(self, order: list[tuple[Hashable, int]], tokens: list[int] | torch.Tensor, rows: list[int]):
        n = len(order)
        out = self._run(self._stage(order, tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens))
        if not rows:
            return None, None
        if len(rows) == n:  # every row, in order (a step's rows are distinct and increasing)
            return out["logits"][:n], out["top"][:n]
        idx = torch.tensor(rows, device=self.model.device)
        return out["logits"][idx], out["top"][idx]

    def replay_top(self, order: list[tuple[Hashable, int]], tokens: list[int] | None = None, src: list[int] | None = None,
                   prev_top: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """A decode step (one token per sequence of ``order``) replayed without reading anything back: the argmax
        ids of its bucket on the device (the graph's own buffer: read or gather from it before that bucket's next
        replay).  The tokens are ``tokens``, or still on the device: sequence i's is ``prev_top[src[i]]``, the step
        before's argmax (the scheduler's lookahead)."""
        if tokens is not None:
            return self._run(self._stage(order, tokens))["top"]
        b = self._stage(order, src)  # the ids region holds the rows of prev_top to take (padding: row 0)
        ids = self.head[:b]
        ids.copy_(prev_top.index_select(0, ids))
        return self._run(b)["top"]

    def _stage(self, order: list[tuple[Hashable, int]], ids: list[int]) -> int:
        """The static buffers of a decode step of ``order`` with token ids ``ids``: one copy of the head buffer
        and the changed block-table rows; returns the bucket it replays."""
        self.capture()
        n = len(order)
        b = self.bucket(n)
        positions, slots, tables = self.cache.schedule_decode([s for s, _ in order])
        pad = b - n
        pad_slot = self.scratch * self.cache.block_size
        head = ids + [0] * pad + positions + [0] * pad + slots + [pad_slot] * pad + [p + 1 for p in positions] + [1] * pad
        if self.copied is not None:
            self.copied.synchronize()  # the last step's copies out of the pinned staging buffers are done
        self.stage_np[: 4 * b] = head
        dst, src = self.heads[b]
        dst.copy_(src, non_blocking=True)
        self.staged.update(tables)
        if self.copied is not None:
            self.copied.record()
        return b

    def _run(self, b: int) -> dict[str, torch.Tensor]:
        if self.static:
            with torch.no_grad():
                out = self._forward(b)
        else:
            g, out = self.graphs[b]
            g.replay()
        self.replays += 1
        return out
