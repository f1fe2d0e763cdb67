"""Limits that hold for every client, before anything of a request's body is read.

Two layers, both ahead of the application:

- :func:`protocol_class`: uvicorn's h11 connection with a header deadline.  A connection must deliver a
  whole request head within ``header_timeout_s`` of connecting (or of its previous response), or it
  is closed: a client trickling header bytes (slowloris) holds a socket for that long, not forever.
  h11 itself refuses a malformed, negative or conflicting ``Content-Length`` and heads over 16 KiB;
  its refusal is a 400 with the OpenAI error body, and the connection is closed.
- :class:`Guard`, an ASGI middleware, in this order from the head alone: a ``Content-Length`` together
  with ``Transfer-Encoding`` (a request smuggling vector) is a 400; a declared body over
  ``max_body_bytes`` a 413; ``/v1/*`` without the API key a 401; an unknown path a 404, a known path
  with another method a 405.  Only then is the body read, at most ``max_body_bytes`` (a chunked body
  is counted as it comes) within ``body_timeout_s`` (a 408 past it).  Every refusal made before the
  body was read in full says ``Connection: close`` and closes the connection: the unread bytes are
  never parsed as a next request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 16 << 20  # a request body, declared or counted
    header_timeout_s: float = 10.0  # connect (or previous response) to a whole request head
    body_timeout_s: float = 60.0  # head to a whole body
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    backlog: int = 2048  # pending connects the kernel queues (capped by net.core.somaxconn)
    max_seqs_per_request: int = 256  # prompts x n of one request
    max_tokens_per_request: int = 1 << 18  # prompt + max_tokens, summed over a request's sequences
    max_waiting_seqs: int = 1024  # sequences waiting for admission before new requests get a 503

    def __post_init__(self) -> None:
        for name, v in vars(self).items():
            if not v > 0:
                raise ValueError(f"{name} must be positive, got {v}")


class Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body length, or None for a chunked (or absent) body; h11 has checked its syntax."""
    length = chunked = None
    for k, v in headers:
        if k == b"content-length":
            length = int(v)
        elif k == b"transfer-encoding":
            chunked = True
    if length is not None and chunked:
        raise Refusal(400, "a request cannot have both Content-Length and Transfer-Encoding")
    return length


async def _read_body(receive, limit: int, timeout: float) -> bytes:
    loop = asyncio.get_running_loop()
    deadline, parts, size = loop.time() + timeout, [], 0
    while True:
        try:
            msg = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise Refusal(408, f"the request body did not arrive within {timeout:g} s") from None
        if msg["type"] == "http.disconnect":
            raise ConnectionError("the client went away")
        size += len(msg.get("body", b""))
        if size > limit:
            raise Refusal(413, f"the request body is larger than this server's limit of {limit} bytes")
        parts.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive):
    """An ASGI receive that gives the body read already, then the connection's own (its disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class Guard:
    """The ASGI middleware above: ``server.api_key`` is read per request, ``routes`` maps path -> methods."""

    def __init__(self, app, server, routes: dict[str, set[str]]) -> None:
        self.app, self.server, self.routes = app, server, routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limits = self.server.limits
        try:
            self._check_head(scope, limits)
            body = await _read_body(receive, limits.max_body_bytes, limits.body_timeout_s)
        except Refusal as r:
            return await refuse(send, r.status, str(r), close=True)
        except ConnectionError:
            return
        await self.app(scope, _replay(body, receive), send)

    def _check_head(self, scope, limits: Limits) -> None:
        length = _content_length(scope["headers"])
        if length is not None and length > limits.max_body_bytes:
            raise Refusal(413, f"the request body of {length} bytes is larger than this server's limit of {limits.max_body_bytes}")
        path, key = scope["path"], self.server.api_key
        if key is not None and path.startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, f"Bearer {key}".encode()):
                raise Refusal(401, "Unauthorized: a valid API key is needed")
        methods = self.routes.get(path)
        if methods is None:
            raise Refusal(404, f"no route {scope['method']} {path}")
        if scope["method"] not in methods:
            raise Refusal(405, f"{path} takes {', '.join(sorted(methods))}, not {scope['method']}")


async def refuse(send, status: int, message: str, close: bool = False, headers: dict | None = None) -> None:
    """One OpenAI error response, sent straight through ASGI."""
    from ..protocol import error_body

    data = json.dumps(error_body(message, status)).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    head += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    if close:
        head.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def protocol_class(header_timeout_s: float):
    """uvicorn's h11 protocol with the header deadline, and its own 400s in the OpenAI error body."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from ..protocol import error_body

    class GuardedH11(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _timed: object = None  # the request cycle the running deadline waits for (None: the first)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._timed = self.cycle
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            if self.cycle is self._timed and not self.transport.is_closing():
                self.transport.close()  # no whole request head in time

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._timed:  # a request head arrived
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # the next request on this connection gets its own deadline
            super().on_response_complete()
            if self.cycle is not self._timed:  # a pipelined request was already there
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            data = json.dumps(error_body("not a valid HTTP/1.1 request (request line, headers or Content-Length)", 400)).encode()
            head = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=head, reason=b"Bad Request"), h11.Data(data=data), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return GuardedH11
