"""The engine thread: the one owner of the model and the KV cache, in the engine's process.

The HTTP side runs in processes of its own (:mod:`.front`, vLLM's API-server / engine-core split; one or
more, ``--api-server-count``, each accepting on the same listening socket): they share no interpreter lock
with the engine, so neither the engine's host work per step nor the fronts' per-request and per-token work
(parsing, JSON, server-sent events, sockets) waits for the other.  Each front talks to the engine over a
local socket of its own (:class:`multiprocessing.connection.Connection`, pickled tuples); a front's ``sid``
numbers its HTTP requests, and the engine keys them by (front, sid):

front -> engine: ``("add", sid, items)`` (items: choice index, prompt ids, params, detokenizer settings),
``("abort", [request ids])``, ``("metrics", token, model name)``, ``("ready",)`` once it listens,
``("api_key_set",)`` once it asks for a new key, ``("stop",)`` as it stops.
engine -> front: ``("answer", sid, [request ids] | error)``, per step one ``("deltas", entries)``, each entry
``("delta", request id, text, tokens, logprobs, finish reason, stop reason, prompt logprobs | None)`` or
``("fail", sid, message)``, ``("metrics", token, text)``, ``("api_key", key)``, ``("broken", message)``.

The thread blocks on the socket while idle and otherwise steps the continuous batch, taking only what is
already there between steps.  The waiting queue is bounded: a submission that finds ``max_waiting``
sequences already waiting for admission is refused with :class:`Busy` (the server answers 503 with
``Retry-After``); one request always enters an empty queue, whatever its size (the per-request caps bound that).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid

from multiprocessing.connection import wait

from ..request import EngineBroken, Request, RequestError
from ..scheduler import LLMEngine
from ..text import ModelText

IDLE_POLL_S = 0.05  # an idle thread checks for stop() this often (a message wakes it at once)


class Busy(Exception):
    """The waiting queue is full: the client should come back later."""


class EngineLoop(threading.Thread):
    """Takes submissions from the front, steps while there is work, sends each step's deltas back at once."""

    def __init__(self, engine: LLMEngine, max_waiting: int, text: ModelText) -> None:
        super().__init__(name="quantkit-engine", daemon=True)
        self.engine, self.max_waiting, self.text = engine, max_waiting, text
        self.conns: list = []  # the fronts' sockets (multiprocessing Connections), set before start()
        self.open: dict = {}  # connection -> its front's index, while it is there
        self.sinks: dict[Request, list] = {}  # request -> [(front, sid), tokens sent, prompt logprobs sent]
        self.by_id: dict[str, Request] = {}
        self.outbox: dict[int, list[tuple]] = {}  # this step's entries, per front
        self.waiting_ready = 0  # fronts not listening yet
        self.lock = threading.Lock()  # held while the engine's state changes (readers in this process take it)
        self.send_lock = threading.Lock()  # the connection is written by this thread and by Server (api_key)
        self.error: EngineBroken | None = None  # why the engine stopped for good, if it did
        self.on_ready = self.on_broken = None  # called from this thread: the front listens; the engine broke
        self._stopping = threading.Event()
        self._acks, self._acked = 0, threading.Event()  # fronts yet to take a new API key; set when none is left

    def stop(self) -> None:
        self._stopping.set()

    def send(self, front: int, msg: tuple) -> bool:
        """To one front; False when it is gone."""
        try:
            with self.send_lock:
                self.conns[front].send(msg)
            return True
        except (OSError, ValueError):  # closed, or a broken pipe: that front went away
            return False

    def broadcast(self, msg: tuple) -> None:
        for k in range(len(self.conns)):
            self.send(k, msg)

    def set_api_key(self, key: str | None, timeout_s: float = 10.0) -> None:
        """Every front asks for ``key`` from its next request on: returns once each has said it does."""
        with self.send_lock:
            self._acks, self._acked = len(self.open), threading.Event()
        self.broadcast(("api_key", key))
        if not self._acked.wait(timeout_s if self._acks else 0):
            raise RuntimeError(f"the HTTP fronts did not take the API key within {timeout_s:g} s")

    def run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # a lost rank (EngineBroken), or a bug of this thread's: the server stops with it
            if not isinstance(e, EngineBroken):
                traceback.print_exc(file=sys.stderr)
                e = EngineBroken(f"the engine thread failed: {type(e).__name__}: {e}")
            self.error = e
            print(f"error: {e}", file=sys.stderr, flush=True)
            self.broadcast(("broken", str(e)))
            if self.on_broken is not None:
                self.on_broken()
        finally:  # stopped (or broken): requests still running end with an error
            self._fail_all(str(self.error or "the server is shutting down"))
            self._flush()

    def _loop(self) -> None:
        tick, ticked = self.engine.idle_tick_s, time.monotonic()  # sharded serving: a heartbeat to the other ranks
        self.open = {c: k for k, c in enumerate(self.conns)}
        self.waiting_ready = len(self.conns)
        while self.open and not self._stopping.is_set():
            ready = wait(list(self.open), 0 if self.engine.has_work() else IDLE_POLL_S)
            while ready:  # while there is work, only take what is already there
                for c in ready:
                    self._read(c)
                ready = wait(list(self.open), 0) if self.open else []
            if self.engine.has_work():
                self._step()
            elif tick is not None and time.monotonic() - ticked >= tick:
                ticked = time.monotonic()
                with self.lock:
                    self.engine.tick()
            self._flush()

    def _read(self, conn) -> None:
        front = self.open[conn]
        try:
            if self._take(front, conn.recv()):
                return
        except (EOFError, OSError):  # that front is gone
            pass
        del self.open[conn]  # it stopped: what it had running ends
        self._fail_front(front)

    def _take(self, front: int, msg: tuple) -> bool:
        kind = msg[0]
        if kind == "abort":
            with self.lock:
                for rid in msg[1]:
                    r = self.by_id.pop(rid, None)
                    if r is not None:
                        self.engine.abort(r)
                        self.sinks.pop(r, None)
        elif kind == "add":
            self.send(front, ("answer", msg[1], self._answer((front, msg[1]), msg[2])))
        elif kind == "metrics":
            from ..metrics import render

            with self.lock:
                self.send(front, ("metrics", msg[1], render(self.engine, msg[2])))
        elif kind == "api_key_set":
            with self.send_lock:
                self._acks -= 1
                if self._acks <= 0:
                    self._acked.set()
        elif kind == "ready":
            self.waiting_ready -= 1
            if self.waiting_ready == 0 and self.on_ready is not None:
                self.on_ready()
        elif kind == "stop":
            return False
        return True

    def _answer(self, sid: tuple[int, int], items: list) -> list[str] | Exception:
        try:
            return [r.id for r in self._add(sid, items)]
        except (RequestError, Busy) as e:
            return e
        except Exception as e:  # never let one request take the engine thread down
            traceback.print_exc(file=sys.stderr)
            return RuntimeError(f"the engine could not take the request: {e}")

    def _add(self, sid: tuple[int, int], items: list) -> list[Request]:
        waiting = len(self.engine.waiting)
        if waiting and waiting + len(items) > self.max_waiting:
            raise Busy(f"{waiting} sequences are waiting for admission (at most {self.max_waiting}): try again shortly")
        for _, prompt, params, _ in items:  # check all before queuing any
            self.engine.check_request(prompt, params)
        reqs = []
        with self.lock:
            try:
                for i, p, params, detok in items:
                    d = self.text.detokenizer(*detok) if detok is not None else None
                    reqs.append(self.engine.add_request(p, params, f"{uuid.uuid4().hex}-{i}", d, checked=True, group=sid))
            except BaseException:  # all or nothing: no sequence of a refused request is left running
                for r in reqs:
                    self.engine.abort(r)
                raise
        for r in reqs:
            self.sinks[r] = [sid, 0, r.params.prompt_logprobs is None]
            self.by_id[r.id] = r
        return reqs

    def _step(self) -> None:
        try:
            with self.lock:
                advanced = self.engine.step()
        except EngineBroken:
            raise
        except Exception as e:  # a failed step fails its requests, the server stays up
            traceback.print_exc(file=sys.stderr)
            self._fail_all(f"the engine failed on this batch: {e}")
            return
        for r in advanced:
            self._post(r)

    def _post(self, r: Request) -> None:
        sink = self.sinks.get(r)
        if sink is None:
            return
        sid, sent, lp_sent = sink
        if r.error is not None:  # it failed alone: its HTTP request fails (its other choices aborted), no one else's
            print(f"request {r.id} failed: {r.error}", file=sys.stderr)
            return self._fail_sink(sid, f"the engine failed on this request: {r.error}")
        text = r.detok.delta() if r.detok is not None else ""
        tokens, logprobs = r.output[sent:], r.logprobs[sent:]
        sink[1] = len(r.output)
        prompt_lps = None
        if not lp_sent and (r.output or r.finished):  # the prompt's log-probs once its prefill (maybe chunked) is done
            prompt_lps, sink[2] = r.prompt_logprobs, True
        if r.finished:  # the detokenizer was finished with the request: its delta above holds the rest
            del self.sinks[r], self.by_id[r.id]
        if text or tokens or r.finished or prompt_lps is not None:
            self.outbox.setdefault(sid[0], []).append(("delta", r.id, text, tokens, logprobs, r.finish_reason, r.stop_reason, prompt_lps))

    def _fail_all(self, message: str) -> None:
        with self.lock:
            sids = {sink[0] for sink in self.sinks.values()}
            for r in list(self.sinks):
                self.engine.abort(r)
            self.sinks.clear(), self.by_id.clear()
        for front, sid in sids:
            self.outbox.setdefault(front, []).append(("fail", sid, message))

    def _fail_sink(self, sid: tuple[int, int], message: str) -> None:
        with self.lock:
            for r in [r for r, sink in self.sinks.items() if sink[0] == sid]:
                self.engine.abort(r)
                del self.sinks[r], self.by_id[r.id]
        self.outbox.setdefault(sid[0], []).append(("fail", sid[1], message))

    def _fail_front(self, front: int) -> None:
        """A front stopped or went away: its sequences still running are aborted, their blocks freed."""
        with self.lock:
            for r in [r for r, sink in self.sinks.items() if sink[0][0] == front]:
                self.engine.abort(r)
                del self.sinks[r], self.by_id[r.id]
        self.outbox.pop(front, None)

    def _flush(self) -> None:
        """This step's entries to each front: one message a step, not one per delta."""
        for front, entries in self.outbox.items():
            self.send(front, ("deltas", entries))
        self.outbox = {}
