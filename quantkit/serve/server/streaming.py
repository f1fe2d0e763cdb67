"""From a request's engine deltas to its HTTP reply: a whole response, or server-sent events.

A client that goes away is noticed without polling: a whole response waits on its deltas and on the
connection's ``http.disconnect`` at once; a stream is cancelled by the framework's streaming response
when the client disconnects.  Either way the request's sequences still running are aborted, and
their KV blocks freed.  Every chunk goes through its pydantic response model (:func:`.openai_io.render`):
a value JSON cannot carry (NaN, infinity) ends the stream with an error event, never invalid JSON.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from ..protocol import ProtocolError
from .client import Delta, EngineClient, RequestView, Sink


class ClientGone(Exception):
    """The client closed its connection before its response was ready."""


def merge(a: Delta, b: Delta) -> Delta:
    """One delta of a choice's two consecutive ones."""
    return Delta(a.index, a.text + b.text, a.tokens + b.tokens, a.logprobs + b.logprobs, b.finish_reason, b.stop_reason)


async def deltas(reqs: list[RequestView], sink: Sink) -> AsyncIterator[Delta]:
    """The requests' deltas as the engine posts them, until each has finished; an engine failure raises
    ProtocolError 500.  Deltas of one choice already queued behind each other are yielded as one: a client
    whose chunks are written slower than the engine makes tokens gets several tokens a chunk (one render and
    one write for them), one that keeps up gets every token as it comes."""
    left, held = len(reqs), None
    while left:
        d, held = (held, None) if held is not None else (await sink.queue.get(), None)
        if isinstance(d, Exception):
            raise ProtocolError(str(d), 500)
        while d.finish_reason is None and not sink.queue.empty():
            nxt = sink.queue.get_nowait()
            if not isinstance(nxt, Delta) or nxt.index != d.index:
                held = nxt
                break
            d = merge(d, nxt)
        left -= d.finish_reason is not None
        yield d


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def collect(reqs: list[RequestView], sink: Sink, receive, loop: EngineClient) -> list[Delta]:
    """Every delta of a whole (not streamed) response; the client leaving first aborts the requests."""

    async def gather() -> list[Delta]:
        return [d async for d in deltas(reqs, sink)]

    work, gone = asyncio.ensure_future(gather()), asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            loop.abort([r for r in reqs if not r.finished])
    if not work.done() or work.cancelled():
        raise ClientGone
    return work.result()


def _event(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


async def sse(reqs: list[RequestView], chunks: Callable[[AsyncIterator[Delta]], AsyncIterator[str]], sink: Sink,
              loop: EngineClient) -> AsyncIterator[bytes]:
    """Server-sent events of ``chunks(deltas)`` (JSON texts), then ``[DONE]``; an error ends the stream with
    one error event.  Cancelled (the client left) or failed: the requests still running are aborted."""
    try:
        async for c in chunks(deltas(reqs, sink)):
            yield _event(c)
        yield _event("[DONE]")
    except ProtocolError as e:
        yield _event(json.dumps(e.body()))
    finally:
        unfinished = [r for r in reqs if not r.finished]
        if unfinished:
            loop.abort(unfinished)
