"""The engine thread: the one owner of the model and the KV cache, off the HTTP event loop.

HTTP handlers (coroutines on the server's event loop) put submissions and aborts into the thread's
inbox; the thread blocks on that inbox while idle and otherwise steps the continuous batch.  What a
step produced goes back without polling: the thread gathers each step's deltas and hands them to the
event loop with one ``call_soon_threadsafe`` per step, which puts each into its request's asyncio
queue (:class:`Sink`).  A submission is answered the same way (an asyncio future).

The waiting queue is bounded: a submission that finds ``max_waiting`` sequences already waiting for
admission is refused with :class:`Busy` (the server answers 503 with ``Retry-After``); one request
always enters an empty queue, whatever its size (the per-request caps bound that).
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import traceback
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from ..sampling import SamplingParams, TokenLogprobs
from ..request import EngineBroken, Request, RequestError
from ..scheduler import LLMEngine


@dataclass
class Delta:
    """What one request produced since the last delta."""

    index: int
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class Busy(Exception):
    """The waiting queue is full: the client should come back later."""


class Sink:
    """Where one HTTP request's deltas go: an asyncio queue on the event loop that serves it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for q, item in items:
        q.put_nowait(item)


def _answer(fut: asyncio.Future, result, loop: EngineLoop) -> None:
    """Runs on the event loop: a submission's result (requests or the error) to its waiting handler; requests
    whose handler went away meanwhile (cancelled) are aborted."""
    if fut.cancelled():
        if isinstance(result, list):
            loop.abort(result)
    elif isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


class EngineLoop(threading.Thread):
    """Takes submissions, steps while there is work, posts deltas to each request's sink."""

    def __init__(self, engine: LLMEngine, max_waiting: int) -> None:
        super().__init__(name="quantkit-engine", daemon=True)
        self.engine, self.max_waiting = engine, max_waiting
        self.inbox: queue.Queue = queue.Queue()
        self.sinks: dict[Request, tuple[int, Sink, list[int]]] = {}  # request -> (choice index, sink, [tokens sent])
        self.outbox: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)  # this step's deltas, per event loop
        self.lock = threading.Lock()  # held while the engine's state changes (/metrics reads it)
        self.error: EngineBroken | None = None  # why the engine stopped for good, if it did
        self.on_broken = None  # called from this thread when it does (the server then stops)

    async def submit(self, items: list[tuple[int, list[int], SamplingParams, object]], sink: Sink) -> list[Request]:
        """Add requests (choice index, prompt ids, params, detokenizer) whose deltas go to ``sink``.  Raises
        RequestError (or Busy) before anything is queued when one of them cannot be taken."""
        if not self.is_alive():
            raise RuntimeError("the server is shutting down")
        fut = sink.loop.create_future()
        self.inbox.put(("add", items, sink, fut))
        return await fut

    def abort(self, requests: list[Request]) -> None:
        self.inbox.put(("abort", requests))

    def stop(self) -> None:
        self.inbox.put(("stop",))

    def run(self) -> None:
        try:
            self._loop()
        except EngineBroken as e:
            self.error = e
            print(f"error: {e}", file=sys.stderr, flush=True)
            if self.on_broken is not None:
                self.on_broken()
        finally:  # stopped (or broken): requests still running, and submissions not taken, end with an error
            self._fail_all(self.error or RuntimeError("the server is shutting down"))
            self._refuse_inbox()
            self._flush()

    def _loop(self) -> None:
        tick = self.engine.idle_tick_s  # sharded serving: a heartbeat to the other ranks while idle
        while True:
            try:  # block while idle; while there is work, only take what is already there
                msg = self.inbox.get(timeout=tick) if not self.engine.has_work() else self.inbox.get_nowait()
            except queue.Empty:
                msg = None
            while msg is not None:
                if msg[0] == "stop":
                    return
                self._take(msg)
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    msg = None
            if self.engine.has_work():
                self._step()
            elif tick is not None:
                with self.lock:
                    self.engine.tick()
            self._flush()

    def _take(self, msg: tuple) -> None:
        if msg[0] == "abort":
            with self.lock:
                for r in msg[1]:
                    self.engine.abort(r)
                    self.sinks.pop(r, None)
            return
        _, items, sink, fut = msg
        try:
            result = self._add(items, sink)
        except (RequestError, Busy) as e:
            result = e
        except Exception as e:  # never let one request take the engine thread down
            traceback.print_exc(file=sys.stderr)
            result = RuntimeError(f"the engine could not take the request: {e}")
        self._call(sink.loop, _answer, fut, result, self)

    def _add(self, items: list, sink: Sink) -> list[Request]:
        waiting = len(self.engine.waiting)
        if waiting and waiting + len(items) > self.max_waiting:
            raise Busy(f"{waiting} sequences are waiting for admission (at most {self.max_waiting}): try again shortly")
        for _, prompt, params, _ in items:  # check all before queuing any
            self.engine.check_request(prompt, params)
        reqs = []
        with self.lock:
            try:
                for i, p, params, detok in items:
                    reqs.append(self.engine.add_request(p, params, f"{uuid.uuid4().hex}-{i}", detok, checked=True, group=sink))
            except BaseException:  # all or nothing: no sequence of a refused request is left running
                for r in reqs:
                    self.engine.abort(r)
                raise
        for (i, *_), r in zip(items, reqs):
            self.sinks[r] = (i, sink, [0])
        return reqs

    def _step(self) -> None:
        try:
            with self.lock:
                advanced = self.engine.step()
        except EngineBroken:
            raise
        except Exception as e:  # a failed step fails its requests, the server stays up
            traceback.print_exc(file=sys.stderr)
            self._fail_all(RuntimeError(f"the engine failed on this batch: {e}"))
            return
        for r in advanced:
            self._post(r)

    def _post(self, r: Request) -> None:
        sink = self.sinks.get(r)
        if sink is None:
            return
        index, out, sent = sink
        if r.error is not None:  # it failed alone: its HTTP request fails (its other choices aborted), no one else's
            print(f"request {r.id} failed: {r.error}", file=sys.stderr)
            return self._fail_sink(out, RuntimeError(f"the engine failed on this request: {r.error}"))
        d = Delta(index, r.detok.delta() if r.detok is not None else "", r.output[sent[0]:], r.logprobs[sent[0]:])
        sent[0] = len(r.output)
        if r.finished:  # the detokenizer was finished with the request: its delta above holds the rest
            d.finish_reason, d.stop_reason = r.finish_reason, r.stop_reason
            del self.sinks[r]
        if d.text or d.tokens or d.finish_reason:
            self.outbox[out.loop].append((out.queue, d))

    def _fail_all(self, e: Exception) -> None:
        with self.lock:
            for r in list(self.sinks):
                self.engine.abort(r)
                _, out, _ = self.sinks.pop(r)
                self.outbox[out.loop].append((out.queue, e))

    def _fail_sink(self, sink: Sink, e: Exception) -> None:
        with self.lock:
            for r in [r for r, (_, out, _) in self.sinks.items() if out is sink]:
                self.engine.abort(r)
                del self.sinks[r]
        self.outbox[sink.loop].append((sink.queue, e))

    def _refuse_inbox(self) -> None:
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "add":
                self._call(msg[2].loop, _answer, msg[3], RuntimeError("the server is shutting down"), self)

    def _flush(self) -> None:
        """This step's deltas to their event loops: one wake-up per loop, not one per delta."""
        for loop, items in self.outbox.items():
            self._call(loop, _deliver, items)
        self.outbox.clear()

    @staticmethod
    def _call(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # that event loop is closed: no one is left to tell
            pass
