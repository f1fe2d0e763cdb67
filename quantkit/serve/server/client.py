"""The front's side of the engine socket (:mod:`.engine_loop` says what travels on it): submissions and aborts
out, each step's deltas in, put into each HTTP request's asyncio queue (:class:`Sink`) on the event loop.

A reader thread blocks on the socket and hands each message to the event loop with one ``call_soon_threadsafe``
(a step's deltas are one message); everything else runs on the event loop.  The front keeps its own view of
each request (:class:`RequestView`: prompt, parameters, tokens, log-probs, finish), built from the deltas, which
is what the response writers (:mod:`..openai_io`) read.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field

from ..sampling import SamplingParams, TokenLogprobs
from ..text import Detokenizer


@dataclass
class Delta:
    """What one request produced since the last delta."""

    index: int
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class Sink:
    """Where one HTTP request's deltas go: an asyncio queue on the event loop that serves it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()


@dataclass(eq=False)
class RequestView:
    """One sequence of an HTTP request as the front knows it."""

    id: str
    index: int
    prompt: list[int]
    params: SamplingParams
    sid: int
    output: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    detok: Detokenizer | None = None  # its text is made here (no stop string: the engine need not read it)

    def text_of(self, tokens: list[int], finished: bool) -> str:
        """The text ``tokens`` add, as the engine's detokenizer would have made it (every token added, the
        detokenizer finished with the request)."""
        d = self.detok
        for t in tokens:
            d.add(t, check_stop=False)
        if finished:
            d.finish()
        return d.delta()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineClient:
    """Submits to the engine process and routes its answers; every method runs on the event loop."""

    def __init__(self, conn, loop: asyncio.AbstractEventLoop) -> None:
        self.conn, self.loop = conn, loop
        self.sinks: dict[int, tuple[Sink, list]] = {}  # sid -> (sink, its submission) while the engine answers
        self.live: dict[int, list] = {}  # sid -> [sink, sequences still running] while its requests run
        self.views: dict[str, RequestView] = {}
        self.waiting: dict[int, asyncio.Future] = {}  # answers and metrics by sid / token
        self.ids = itertools.count()
        self.alive, self.error = True, None  # error: why the engine stopped (it broke), if it did
        self.on_gone = self.on_api_key = None  # the engine is gone / sets the API key (called on the event loop)
        self._reader = threading.Thread(target=self._read, name="quantkit-engine-reader", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def send(self, msg: tuple) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError):  # the engine process is gone: the reader notices and ends what runs
            pass

    def is_alive(self) -> bool:
        return self.alive

    async def submit(self, items: list[tuple], sink: Sink) -> list[RequestView]:
        """Add sequences (choice index, prompt ids, params, the engine's detokenizer settings, this side's
        detokenizer) whose deltas go to ``sink``: a sequence's text is made by the engine when it has stop strings
        (it stops on them), else here.  Raises RequestError (or Busy) before anything is queued when one of them
        cannot be taken."""
        if not self.alive:
            raise RuntimeError("the server is shutting down")
        sid = next(self.ids)
        fut = self.waiting[sid] = self.loop.create_future()
        self.sinks[sid] = (sink, items)
        self.send(("add", sid, [item[:4] for item in items]))
        return await fut

    def abort(self, reqs: list[RequestView]) -> None:
        ids = [r.id for r in reqs if not r.finished and self.views.pop(r.id, None) is not None]
        for r in reqs:
            if r.id in ids:
                self._done(r.sid)
        if ids:
            self.send(("abort", ids))

    def _done(self, sid: int) -> None:
        """One sequence of ``sid`` ended (finished, or aborted by the front)."""
        live = self.live.get(sid)
        if live is not None:
            live[1] -= 1
            if live[1] == 0:
                del self.live[sid]

    async def metrics(self, model_name: str) -> str:
        token = next(self.ids)
        fut = self.waiting[token] = self.loop.create_future()
        self.send(("metrics", token, model_name))
        return await fut

    def stop(self, why: str = "the server is shutting down") -> None:
        """The server stops: what runs ends with an error now, the engine is told."""
        self._fail_everything(why)
        self.send(("stop",))

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            try:
                self.loop.call_soon_threadsafe(self._handle, msg)
            except RuntimeError:  # the event loop is closed
                return
        try:
            self.loop.call_soon_threadsafe(self._gone)
        except RuntimeError:
            pass

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "deltas":
            self._deliver(msg[1])
        elif kind == "answer":
            self._answer(msg[1], msg[2])
        elif kind == "metrics":
            fut = self.waiting.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
        elif kind == "api_key" and self.on_api_key is not None:
            self.on_api_key(msg[1])
        elif kind == "broken":
            self.error = msg[1]
            self._gone()

    def _answer(self, sid: int, result) -> None:
        fut, entry = self.waiting.pop(sid, None), self.sinks.pop(sid, None)
        if fut is None or entry is None:  # stopped meanwhile: what the engine took must not run on
            if not isinstance(result, BaseException):
                self.send(("abort", result))
            return None
        sink, items = entry
        if isinstance(result, BaseException):
            return None if fut.cancelled() else fut.set_exception(result)
        views = [RequestView(rid, i, prompt, params, sid, detok=d) for rid, (i, prompt, params, _, d) in zip(result, items)]
        self.views.update((v.id, v) for v in views)
        self.live[sid] = [sink, len(views)]
        if fut.cancelled():  # its handler went away meanwhile: nothing of it may run on
            return self.abort(views)
        fut.set_result(views)

    def _deliver(self, entries: list[tuple]) -> None:
        for e in entries:
            if e[0] == "fail":
                live = self.live.pop(e[1], None)
                if live is not None:
                    live[0].queue.put_nowait(RuntimeError(e[2]))
                    for rid in [rid for rid, v in self.views.items() if v.sid == e[1]]:
                        del self.views[rid]
                continue
            _, rid, text, tokens, logprobs, finish, stop_reason, prompt_lps = e
            v = self.views.get(rid)
            if v is None:  # aborted by the front meanwhile
                continue
            v.output += tokens
            v.logprobs += logprobs
            if prompt_lps is not None:
                v.prompt_logprobs = prompt_lps
            v.finish_reason, v.stop_reason = finish, stop_reason
            if v.detok is not None:
                text = v.text_of(tokens, finish is not None)
            live = self.live.get(v.sid)
            if live is not None:
                live[0].queue.put_nowait(Delta(v.index, text, tokens, logprobs, finish, stop_reason))
            if finish is not None:
                del self.views[rid]
                self._done(v.sid)

    def _fail_everything(self, why: str) -> None:
        self.alive = False
        for sink, _ in self.live.values():
            sink.queue.put_nowait(RuntimeError(why))
        self.live.clear(), self.views.clear()
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(RuntimeError(why))
        self.waiting.clear(), self.sinks.clear()

    def _gone(self) -> None:
        self._fail_everything(self.error or "the engine stopped")
        if self.on_gone is not None:
            self.on_gone()
