"""Limits that hold for every client, before anything of a request's body is read.

Two layers, both ahead of the application:

- :func:`protocol_class`: uvicorn's h11 connection with a connection cap and a header deadline.  A
  connection opened past ``max_connections`` gets a 503 with ``Retry-After`` at once (the server
  raises its open-file limit to hold them all, :func:`.._allow_open_files`).  A connection must deliver a
  whole request head within ``header_timeout_s`` of connecting (or of its previous response), or it
  gets a 408 and is closed: a client trickling header bytes (slowloris) holds a socket for that long,
  not forever, and a client whose request was merely late (its packets retransmitted after a full
  accept queue, its process stalled) reads an answer, not a reset.  An idle keep-alive connection
  is closed without one.  h11 itself refuses a malformed, negative or conflicting ``Content-Length``
  and heads over 16 KiB; its refusal is a 400 with the OpenAI error body, and the connection is closed.
- A close the server starts while the client may still be sending (a refusal before the body was
  read, a deadline, h11's 400) lingers (:class:`_LingeringTransport`): the answer is sent, then a
  FIN, and what the client still sends is read and dropped until it closes too (at most
  ``linger_s``).  Closing a socket with unread bytes makes the kernel send a reset, and a client
  that gets it before reading the answer loses the answer: a 413 sent while the client still sent
  its body reached an asyncio client as ``ConnectionResetError`` in 5 of 5 tries.
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
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 16 << 20  # a request body, declared or counted
    header_timeout_s: float = 10.0  # connect (or previous response) to a whole request head
    body_timeout_s: float = 60.0  # head to a whole body
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    linger_s: float = 2.0  # a connection the server closes while the client still sends is drained this long at most
    backlog: int = 2048  # pending connects the kernel queues (capped by net.core.somaxconn)
    max_connections: int = 1024  # open connections past which a new one gets a 503 with Retry-After at once
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


def _error_bytes(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 error response with the OpenAI error body that closes the connection, written past h11
    (its state machine sends no response before a request head, and the connection ends with this one);
    ``extra``: more header lines, each ending in CRLF."""
    from ..protocol import error_body

    data = json.dumps(error_body(message, status)).encode()
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n{extra}"
    return head.encode() + b"connection: close\r\n\r\n" + data


class _LingeringTransport:
    """A connection's transport whose ``close()`` lingers while the client may still be sending (``sending()``:
    its request not read to the end): what was written goes out, then a FIN, and the connection keeps reading
    (its protocol drops what comes) until the client closes too or ``linger_s`` passes.  A client whose
    request was read whole is closed at once, as before.  Everything else is the asyncio transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, linger_s: float,
                 sending: Callable[[], bool]) -> None:
        self._transport, self._loop, self._linger_s, self._sending = transport, loop, linger_s, sending
        self.lingering: asyncio.TimerHandle | None = None  # the close at the end of the linger, once closing

    def __getattr__(self, name: str):
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering is not None or self._transport.is_closing()

    def write(self, data: bytes) -> None:
        if self.lingering is None:  # once closing, the last answer is out: a later one (the app's refusal of a
            self._transport.write(data)  # request whose body h11 already refused) is dropped, as a closed socket would

    def close(self) -> None:
        t = self._transport
        if self.is_closing():
            return
        if not self._sending() or not t.can_write_eof():
            return t.close()
        t.write_eof()  # once the buffered answer is sent
        t.resume_reading()  # flow control may have paused it: the client's bytes must still be drained
        self.lingering = self._loop.call_later(self._linger_s, t.close)

    def closed(self) -> None:
        """The connection is gone: the linger's timer has nothing left to close."""
        if self.lingering is not None:
            self.lingering.cancel()


def protocol_class(header_timeout_s: float, linger_s: float, max_connections: int):
    """uvicorn's h11 protocol with the connection cap (a 503), the header deadline (a 408), the lingering close, and
    h11's own 400s in the OpenAI error body."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    late = f"no whole request head arrived within {header_timeout_s:g} s"
    malformed = "not a valid HTTP/1.1 request (request line, headers or Content-Length)"
    full = f"this server has {max_connections} connections open, its limit: try again shortly"

    class GuardedH11(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _timed: object = None  # the request cycle the running deadline waits for (None: the first)
        _heard = False  # a byte arrived since the deadline was armed

        def connection_made(self, transport) -> None:
            super().connection_made(_LingeringTransport(transport, self.loop, linger_s, self._sending))
            if len(self.connections) > max_connections:  # answered at once, its request drained while it lingers
                self.transport.write(_error_bytes(503, "Service Unavailable", full, "retry-after: 1\r\n"))
                return self.transport.close()
            self._arm()

        def _sending(self) -> bool:
            """The client may still send: no request begun, a head or body not read to its end, or bytes h11 refused."""
            return self.conn.their_state not in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED)

        def _arm(self) -> None:
            self._disarm()
            self._timed, self._heard = self.cycle, False
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            if self.cycle is not self._timed or self.transport.is_closing():
                return
            if self._timed is None or self._heard:  # a first request, or a next one begun, is answered
                self.transport.write(_error_bytes(408, "Request Timeout", late))
            self.transport.close()  # an idle keep-alive connection just closes, as at its keep-alive timeout

        def data_received(self, data: bytes) -> None:
            if self.transport.lingering is not None:
                return  # closing: what still comes is drained, never parsed as a request
            self._heard = True
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
            self.transport.closed()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(_error_bytes(400, "Bad Request", malformed))
            self.transport.close()

    return GuardedH11
