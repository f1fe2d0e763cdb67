"""Sharded serving's front end on rank 0: one scheduler per DP group, behind the engine interface.

DP attention (DeepSeek-V3's deployment, EP = DP x TP): DP group d (ranks d*TP .. d*TP + TP - 1) runs its
own requests through attention and the dense layers, with its own KV cache; the MoE layers span all
ranks.  Rank 0 keeps every group's scheduler (:class:`.scheduler.LLMEngine`; group 0's on its own
model and cache, the others' on caches of block tables alone) and, each step:

1. schedules every group and broadcasts all their plans at once (released sequences, new-token
   counts, token ids, logit rows, the rows wanted on the host) on the control group;
2. runs group 0's forward (and allocates the other groups' blocks in their block tables, as their
   ranks do in their caches); every rank runs its group's (an idle group only joins the MoE exchange,
   :func:`quantkit.engine.parallel.idle_step`), so every block table matches its scheduler's;
3. takes back from each other group's first rank the argmax of every logit row and the rows wanted
   on the host (one ``gather_object``, only in steps where another group has rows), and samples.

Sequences released after the last step (finished, aborted) are sent on their own, so every rank's
cache is empty again when the server is.

New requests go to the group with the fewest running and waiting sequences, then the most free KV
blocks.  The HTTP server hands requests to :class:`DPEngine` as to an ``LLMEngine``.  While idle the
engine thread sends a heartbeat every ``idle_tick_s``, so that the other ranks' waits stay within
the process group's timeout, and any failure of a step is :class:`RanksLost`: the ranks can no
longer be trusted to be in step, so the server stops (a dead rank is an error, never a hang).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import fields

import torch
import torch.distributed as dist

from ..engine.runner import forward_step
from .sampling import SamplingParams
from .request import EngineBroken, EngineStats, Request, RequestError, Step, to_host
from .scheduler import LLMEngine
from .text import Detokenizer

EMPTY = torch.zeros(0, dtype=torch.int64)


class RanksLost(EngineBroken):
    """A sharded step failed (a rank died, hung past the timeout, or raised): serving cannot go on."""


class DPEngine:
    """The DP groups' schedulers as one engine (the interface :class:`.server.Server` drives)."""

    def __init__(self, engines: list[LLMEngine], ctrl, tp: int, idle_tick_s: float) -> None:
        self.engines, self.ctrl, self.tp, self.idle_tick_s = engines, ctrl, tp, idle_tick_s
        for e in engines:
            e.replayed = True
        first = engines[0]
        self.model, self.cache = first.model, first.cache  # rank 0's own group
        self.max_model_len, self.vocab_size, self.eos_ids = first.max_model_len, first.vocab_size, first.eos_ids
        self.group_of: dict[Request, int] = {}
        self.broken: RanksLost | None = None

    # --- requests: LLMEngine's interface ----------------------------------------------------------
    def check_request(self, prompt: list[int], params: SamplingParams) -> None:
        self.engines[0].check_request(prompt, params)  # every group has the same limits

    def pick(self) -> int:
        """The group a new request joins: fewest sequences running and waiting, then most free KV blocks."""
        load = [(len(e.running) + len(e.waiting), -len(e.cache.free_blocks), d) for d, e in enumerate(self.engines)]
        return min(load)[2]

    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str | None = None,
                    detok: Detokenizer | None = None, checked: bool = False, group: Hashable | None = None) -> Request:
        """Queue a request in the group :meth:`pick` names (``group``: its client request, as for LLMEngine)."""
        if self.broken is not None:
            raise RequestError(f"sharded serving has stopped: {self.broken}")
        d = self.pick()
        r = self.engines[d].add_request(prompt, params, request_id, detok, checked, group)
        self.group_of[r] = d
        return r

    def abort(self, r: Request) -> None:
        d = self.group_of.pop(r, None)
        if d is not None:
            self.engines[d].abort(r)

    def has_work(self) -> bool:
        """Requests to run, or released sequences the other ranks have not been told of yet."""
        return any(e.has_work() or e.released for e in self.engines)

    @property
    def waiting(self) -> list[Request]:
        return [r for e in self.engines for r in e.waiting]

    @property
    def running(self) -> list[Request]:
        return [r for e in self.engines for r in e.running]

    @property
    def kv_usage(self) -> float:
        return sum(e.kv_usage for e in self.engines) / len(self.engines)

    @property
    def stats(self) -> EngineStats:
        """The groups' counters summed."""
        out = EngineStats()
        for e in self.engines:
            for f in fields(EngineStats):
                if f.name != "finished":
                    setattr(out, f.name, getattr(out, f.name) + getattr(e.stats, f.name))
            for k, v in e.stats.finished.items():
                out.finished[k] = out.finished.get(k, 0) + v
        return out

    # --- steps ------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Request]:
        """One step of every group; the requests that advanced.  Any failure is :class:`RanksLost`."""
        if self.broken is not None:
            raise self.broken
        steps = [e.prepare() for e in self.engines]
        try:
            if all(st is None for st in steps):  # the last requests finished: their ranks release them now
                dist.broadcast_object_list([("release", [e.take_released() for e in self.engines])], src=0, group=self.ctrl)
                return []
            results = self._run(steps)
        except Exception as e:
            self.broken = RanksLost(f"a sharded step failed, serving stops: {type(e).__name__}: {e}")
            raise self.broken from e
        done = []
        for e, st, res in zip(self.engines, steps, results):
            if st is not None:
                done += e.complete(st, *res)
        for r in done:
            if r.finished:
                self.group_of.pop(r, None)
        return done

    def _run(self, steps: list[Step | None]) -> list[tuple[list[int], dict[int, torch.Tensor]]]:
        """Broadcast every group's plan, run group 0's forward, take back the other groups' logits."""
        plans = []
        for e, st in zip(self.engines, steps):
            released = e.take_released()
            plans.append((released, [], EMPTY, [], []) if st is None else (released, st.order, st.tokens, st.rows, e.host_rows(st)))
        dist.broadcast_object_list([("step", plans)], src=0, group=self.ctrl)
        for e, st in zip(self.engines[1:], steps[1:]):  # the block tables the other groups' ranks allocate now
            if st is not None:
                e.cache.schedule(dict(st.order))
        _, order, tokens, rows, need = plans[0]
        logits = forward_step(self.model, self.cache, order, tokens, rows, [len(p[2]) for p in plans])
        results = [to_host(logits, need)]
        if any(p[3] for p in plans[1:]):
            replies = [None] * dist.get_world_size(self.ctrl)
            dist.gather_object(None, replies, dst=0, group=self.ctrl)
            results += [replies[d * self.tp] or ([], {}) for d in range(1, len(plans))]
        else:
            results += [([], {})] * (len(plans) - 1)
        return results

    def tick(self) -> None:
        """While idle: a heartbeat to the other ranks (their wait for the next step stays within the timeout)."""
        if self.broken is not None:
            raise self.broken
        try:
            dist.broadcast_object_list([("tick",)], src=0, group=self.ctrl)
        except Exception as e:
            self.broken = RanksLost(f"a rank stopped answering, serving stops: {type(e).__name__}: {e}")
            raise self.broken from e
