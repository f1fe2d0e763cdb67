"""Expert-parallel dispatch and combine by all-to-all: each token goes only to the ranks that own one
of its routed experts, and each rank returns the weighted sum of its experts' outputs for it.

Every rank brings its own tokens (its data-parallel group's share of the step, possibly none) and
their routing (weights float32 [T, k], global expert ids [T, k]); ``owner[e]`` is the rank holding
expert e.  Per MoE layer:

1. **dispatch**: one row per (token, destination rank) pair that has at least one of the token's
   experts, so a token routed to two experts of one rank is sent once; the row carries the token's
   hidden state and, in a metadata exchange beside it, the token's k expert ids with the slots of
   other ranks set to -1 and its k weights.  Rows go out grouped by destination, tokens ascending.
2. each rank runs its local (token, slot) pairs as one-slot rows (:class:`.parallel.ExpertParallel`'s
   rule, so its expert work is its own pairs only), weights each expert's output in float32 and sums
   them per received row in float32;
3. **combine**: the float32 partial sums go back along the same splits, reversed, and the sender
   adds them per token in float32 (ascending destination rank), then rounds once to x's dtype.

Two ways to size the exchange:

* variable splits (prefill): the row counts are exchanged first (one small all-to-all), then the
  payload with those split sizes: bytes are exactly the routed pairs';
* fixed capacity (decode): every (source, destination) pair has ``capacity`` rows; unused rows carry
  expert ids -1, and the receiver runs every received slot (a slot not its own at weight 0), so no
  count is exchanged and no shape depends on the routing: nothing waits for the host (a decode
  step's token count is bounded by ``max_num_seqs``).

The all-reduce design (:class:`.parallel.ExpertParallel`: every rank sees every token, one
float32 all-reduce of [T, H]) stays the alternative; :meth:`AllToAll.bytes` and
:func:`all_reduce_bytes` count what each moves per layer, for the same routing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import formats


@dataclass
class Traffic:
    """Bytes this rank sent to and received from the other ranks, per phase, summed over calls."""

    dispatch_sent: int = 0
    dispatch_received: int = 0
    combine_sent: int = 0
    combine_received: int = 0

    def add(self, phase: str, sent: int, received: int) -> None:
        setattr(self, f"{phase}_sent", getattr(self, f"{phase}_sent") + sent)
        setattr(self, f"{phase}_received", getattr(self, f"{phase}_received") + received)


def destination_slots(idx: torch.Tensor, owner: torch.Tensor, world: int) -> torch.Tensor:
    """Global expert ids [T, k] -> [T, W, k]: for each destination rank the token's slots whose expert it
    owns, -1 elsewhere (a token has a row for rank d when any of its slots does)."""
    dests = torch.arange(world, device=idx.device)
    return torch.where(owner[idx][:, None, :] == dests[None, :, None], idx[:, None, :], -1)


def row_bytes(hidden: int, k: int, payload: str) -> int:
    """Bytes of one dispatched row: the hidden state (``bf16``, ``f32``, or quantized as a format's activations:
    E4M3 + its scales, ``fp8-block`` a float32 per 128, ``mxfp8`` an E8M0 byte per 32) plus the k int64 ids and
    k float32 weights."""
    plain = {"bf16": 2, "f32": 4}
    x = plain[payload] * hidden if payload in plain else hidden + formats.get(payload).act_scale.row_bytes(hidden)
    return x + 12 * k


def all_reduce_bytes(tokens: int, hidden: int, world: int) -> int:
    """Bytes one rank sends (and receives) in a ring all-reduce of float32 [tokens, hidden]: 2 (W-1)/W of it."""
    return 2 * (world - 1) * tokens * hidden * 4 // world if world > 1 else 0


class AllToAll:
    """A MoE layer's routed experts when each rank holds a subset (``local_ids``, global ids ascending)
    and brings its own tokens.  ``capacity``: the most tokens a rank brings to a fixed-capacity exchange
    (None: variable splits only)."""

    def __init__(self, owner: list[int], local_ids: list[int], group=None, capacity: int | None = None) -> None:
        self.owner = torch.tensor(owner, dtype=torch.int64)
        g2l = torch.full((len(owner),), -1, dtype=torch.int64)
        g2l[torch.tensor(local_ids, dtype=torch.int64)] = torch.arange(len(local_ids))
        self.g2l, self.group, self.capacity = g2l, group, capacity
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.traffic, self.calls = Traffic(), 0

    def routed(self, experts, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, fixed: bool = False) -> torch.Tensor:
        """x [T, H] this rank's tokens, weights float32 [T, k], global ids [T, k] -> [T, H] in x.dtype.  Rows
        travel as the experts consume them: quantized once here where they quantize their input
        (``experts.quantize_input``: E4M3 + scales), else as x."""
        self.calls += 1
        ids = destination_slots(idx, self.owner.to(idx.device), self.world)
        hit = (ids >= 0).any(-1)  # [T, W]
        quantize = getattr(experts, "quantize_input", None)
        q = quantize(x) if quantize is not None else None
        payload = Payload((x,) if q is None else q, x.dtype)
        exchange = self._fixed if fixed else self._variable
        return exchange(experts, payload, weights, ids, hit).to(x.dtype)

    def _variable(self, experts, payload: Payload, weights, ids, hit) -> torch.Tensor:
        """Rows grouped by destination, tokens ascending; the counts exchanged first."""
        dest, tok = torch.where(hit.T)
        counts = torch.bincount(dest, minlength=self.world)
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, group=self.group)
        out_sizes, in_sizes = counts.tolist(), recv.tolist()
        got = [self._send(t, out_sizes, in_sizes, "dispatch") for t in (*payload.wire(tok), ids[tok, dest], weights[tok])]
        back = self._send(self._local(experts, payload.like(got[:-2]), *got[-2:]), in_sizes, out_sizes, "combine")  # float32 [R, H]
        out = torch.zeros(hit.shape[0], back.shape[1], dtype=torch.float32, device=back.device)
        return out.index_add_(0, tok, back)

    def _fixed(self, experts, payload: Payload, weights, ids, hit) -> torch.Tensor:
        """Every (source, destination) pair has ``capacity`` rows; a token's row for destination d is
        its rank among the tokens bound for d (a cumulative sum on the device), unused rows carry ids -1,
        and pairs that send nothing are scattered to a spare row: no data-dependent shape, no count exchanged."""
        t, c = hit.shape[0], self.capacity
        if c is None or t > c:
            raise ValueError(f"fixed-capacity exchange: {t} tokens on this rank, capacity {c}")
        n = self.world * c
        dests = torch.arange(self.world, device=hit.device)
        at = torch.where(hit, dests * c + hit.cumsum(0) - 1, n)  # [T, W]; n: the spare row

        def scatter(src: torch.Tensor, fill, per_dest: bool = False) -> torch.Tensor:  # -> [n, ...] (+ the spare row, dropped)
            src = src if per_dest else src[:, None].expand(t, self.world, *src.shape[1:])  # [T, W, ...]
            buf = torch.full((n + 1, *src.shape[2:]), fill, dtype=src.dtype, device=src.device)
            buf[at.flatten()] = src.flatten(0, 1)
            return buf[:n]

        even = [c] * self.world
        sent = [scatter(p, 0) for p in payload.wire()] + [scatter(ids, -1, per_dest=True), scatter(weights, 0.0)]
        got = [self._send(s, even, even, "dispatch") for s in sent]
        back = self._send(self._local_fixed(experts, payload.like(got[:-2]), *got[-2:]), even, even, "combine")  # float32 [n, H]
        back = torch.cat((back, back.new_zeros(1, back.shape[1])))[at]  # [T, W, H], zeros where nothing was sent
        return back.sum(1)  # ascending destination rank

    def _send(self, t: torch.Tensor, out_sizes: list[int], in_sizes: list[int], phase: str) -> torch.Tensor:
        """all_to_all_single of rows: ``out_sizes`` rows to each rank, ``in_sizes`` from each; counted in :attr:`traffic`."""
        t = t.contiguous()
        out = torch.empty((sum(in_sizes), *t.shape[1:]), dtype=t.dtype, device=t.device)
        dist.all_to_all_single(out, t, in_sizes, out_sizes, group=self.group)
        row = math.prod(t.shape[1:]) * t.element_size()
        self.traffic.add(phase, row * (sum(out_sizes) - out_sizes[self.rank]), row * (sum(in_sizes) - in_sizes[self.rank]))
        return out

    def _local(self, experts, payload: Payload, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Received rows' local (token, slot) pairs as one-slot rows, summed per row in float32 -> [R, H]."""
        local = torch.where(ids >= 0, self.g2l.to(ids.device)[ids.clamp_min(0)], -1)
        tok, slot = torch.where(local >= 0)
        rows, hidden = ids.shape[0], payload.tensors[0].shape[1]
        out = torch.zeros(rows, hidden, dtype=torch.float32, device=ids.device)
        if tok.numel():
            x, x_q = payload.rows(tok)
            ones = torch.ones((tok.numel(), 1), dtype=w.dtype, device=w.device)  # weighted below, in float32 (ExpertParallel's rule)
            y = experts(x, ones, local[tok, slot, None]) if x_q is None else experts(x, ones, local[tok, slot, None], x_q=x_q)
            out.index_add_(0, tok, y.to(torch.float32) * w[tok, slot, None].to(torch.float32))
        return out

    def _local_fixed(self, experts, payload: Payload, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """:meth:`_local` in fixed shapes: every received slot runs as a one-slot row (a slot of another rank,
        or of an unused row, on local expert 0 with weight 0), so nothing here waits for the host."""
        n, k = ids.shape
        local = torch.where(ids >= 0, self.g2l.to(ids.device)[ids.clamp_min(0)], -1)  # [n, k]
        rows = torch.arange(n, device=ids.device).repeat_interleave(k)  # [n * k]: row of each slot
        x, x_q = payload.rows(rows)
        ones = torch.ones((n * k, 1), dtype=w.dtype, device=w.device)
        slot_ids = local.clamp_min(0).view(-1, 1)
        y = experts(x, ones, slot_ids) if x_q is None else experts(x, ones, slot_ids, x_q=x_q)  # [n * k, H]
        weight = torch.where(local >= 0, w.to(torch.float32), 0.0).view(-1, 1)
        return (y.to(torch.float32) * weight).view(n, k, -1).sum(1)  # slots ascending, float32


@dataclass
class Payload:
    """What a row carries: (x,) unquantized, or (E4M3 values, scales) as the experts consume them, and the
    activations' dtype.  On the wire 8-bit floats travel as uint8 (gloo and NCCL move bytes)."""

    tensors: tuple[torch.Tensor, ...]
    dtype: torch.dtype

    def wire(self, rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        ts = [t if rows is None else t[rows] for t in self.tensors]
        return [t.view(torch.uint8) if t.element_size() == 1 else t for t in ts]

    def like(self, received: list[torch.Tensor]) -> Payload:
        return Payload(tuple(r.view(t.dtype) for r, t in zip(received, self.tensors, strict=True)), self.dtype)

    def rows(self, tok: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(x rows, None) unquantized; (a placeholder of x's shape and dtype, (values, scales)) quantized."""
        if len(self.tensors) == 1:
            return self.tensors[0][tok], None
        q, s = self.tensors
        return torch.empty(tok.numel(), q.shape[1], dtype=self.dtype, device=q.device), (q[tok], s[tok])


class ExchangeStep:
    """What every MoE layer of a step agrees on: the step's token count per DP group (rank 0 sends them
    with the step) decides fixed capacity (every rank's share fits ``capacity``) or variable splits, the
    same on every rank, so the ranks' all-to-alls match."""

    def __init__(self, capacity: int, tp: int) -> None:
        self.capacity, self.tp, self.fixed = capacity, tp, False

    def begin(self, sizes: list[int]) -> None:
        self.fixed = max(-(-int(n) // self.tp) for n in sizes) <= self.capacity


class ExpertExchange:
    """A MoE layer's routed experts over all ranks by all-to-all (:class:`AllToAll`), in the interface of
    :class:`.parallel.ExpertParallel`: the TP ranks of a group hold the same tokens, so TP rank t brings
    rows [t c, (t + 1) c) of them (c = ceil(T / tp)) and the group's shares are all-gathered after."""

    def __init__(self, a2a: AllToAll, step: ExchangeStep, tp: int, tp_group) -> None:
        self.a2a, self.step, self.tp, self.tp_group = a2a, step, tp, tp_group

    def routed(self, experts, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        c = -(-t // self.tp)
        start = (self.a2a.rank % self.tp) * c
        share = slice(start, min(t, start + c))
        y = self.a2a.routed(experts, x[share], weights[share], idx[share], fixed=self.step.fixed)  # [n, H] x.dtype
        if self.tp == 1:
            return y
        mine = torch.zeros(c, x.shape[1], dtype=y.dtype, device=y.device)
        mine[: y.shape[0]] = y
        group = torch.empty(self.tp * c, x.shape[1], dtype=y.dtype, device=y.device)
        dist.all_gather_into_tensor(group, mine, group=self.tp_group)
        return group[:t]


def attach_all_to_all(moe: list[tuple[int, object]], experts_of: dict[str, list[int]], n_global: int, tp: int, tp_group,
                      max_num_seqs: int) -> ExchangeStep:
    """Give each MoE layer (index, module) an :class:`ExpertExchange`; every rank's expert ids per layer are
    gathered once (the owner table).  The returned :class:`ExchangeStep` takes each step's sizes."""
    lists = [None] * dist.get_world_size()
    dist.all_gather_object(lists, {str(i): experts_of[str(i)] for i, _ in moe})
    step = ExchangeStep(-(-max_num_seqs // tp), tp)
    for i, mlp in moe:
        owner = [-1] * n_global
        for r, held in enumerate(lists):
            for e in held[str(i)]:
                owner[e] = r
        if min(owner) < 0:
            raise ValueError(f"MoE layer {i}: experts {[e for e, r in enumerate(owner) if r < 0]} are on no rank")
        a2a = AllToAll(owner, experts_of[str(i)], capacity=step.capacity)
        mlp.ep = ExpertExchange(a2a, step, tp, tp_group)
    return step


def traffic(model) -> dict[str, int] | None:
    """This rank's all-to-all bytes over every MoE layer of ``model`` (phase_sent / phase_received) and the
    layer calls they add up over, or None where its MoE layers do not exchange by all-to-all."""
    layers = [m.ep for m in model.modules() if isinstance(getattr(m, "ep", None), ExpertExchange)]
    if not layers:
        return None
    total = {k: sum(getattr(e.a2a.traffic, k) for e in layers) for k in vars(Traffic())}
    total["layer_calls"] = sum(e.a2a.calls for e in layers)
    return total
