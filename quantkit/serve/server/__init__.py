"""``quantkit serve``'s HTTP side: an OpenAI-compatible server over :class:`..scheduler.LLMEngine`, FastAPI on
uvicorn.

One engine thread owns the model and the KV cache and steps the continuous batch (:mod:`.engine_loop`);
uvicorn's event loop runs the HTTP side (:mod:`.app`), behind limits that hold before a body is read
(:mod:`.limits`); replies and streams are :mod:`.streaming`.  Endpoints: ``POST /v1/completions``,
``POST /v1/chat/completions`` (each with ``"stream": true`` as server-sent events), vLLM's
``POST /tokenize``, ``/detokenize`` and ``GET /tokenizer_info``, ``GET /v1/models``, ``/health``,
``/version``, ``/metrics`` (Prometheus text).

fastapi, uvicorn and pydantic (the ``serve`` extra) are imported by this package alone: the engine and
sharded serving's other ranks run without them.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from ..scheduler import LLMEngine
from ..text import ModelText
from .limits import Limits

__all__ = ["Limits", "Server"]

OWN_FILES = 256  # files the server holds besides its connections: libraries, the engine, refused connections draining


def _allow_open_files(connections: int) -> None:
    """Raise the soft open-file limit to the hard one (as the Go runtime does), which must hold ``connections``
    sockets and the server's own files.  Past the soft limit accept() fails (asyncio then logs each failed try and
    stops accepting for a second) and, before anyio's backend was imported at start, each stream's first use of it
    failed with a 500: 411 of 2048 requests with 2048 clients under a soft limit of 1280."""
    import resource

    need = connections + OWN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ValueError(f"{connections} connections (--max-connections) need {need} open files, more than this "
                         f"process's hard limit of {hard} (ulimit -Hn): lower --max-connections or raise the limit")
    target = need if hard == resource.RLIM_INFINITY else hard  # a burst past the cap holds files too
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _listen(address: tuple[str, int], backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Server:
    """Bound at construction (``--port 0`` picks a port, :attr:`url` names it); :meth:`serve` runs it in this
    thread, :meth:`start_background` in another, :meth:`close` stops either."""

    def __init__(self, address: tuple[str, int], engine: LLMEngine, text: ModelText, model_name: str,
                 limits: Limits | None = None) -> None:
        from .engine_loop import EngineLoop

        self.engine, self.text, self.model_name = engine, text, model_name
        self.limits = limits or Limits()
        self.loop = EngineLoop(engine, self.limits.max_waiting_seqs)
        self.started = int(time.time())
        self.ctrl = None  # the control group of sharded serving (rank 0 broadcasts each step on it)
        self.api_key: str | None = None  # when set, /v1/* asks for "Authorization: Bearer <key>"
        _allow_open_files(self.limits.max_connections)
        import fastapi  # noqa: F401  (before the socket listens: an install that cannot import it fails here, not its clients)

        self.socket = _listen(address, self.limits.backlog)
        self.server_address = self.socket.getsockname()[:2]
        self._uvicorn = None
        self._background: threading.Thread | None = None
        self._up = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def _config(self, log_level: str):
        import anyio._backends._asyncio  # noqa: F401 (anyio imports it at a first stream: under EMFILE that import failed, a 500 each)
        import uvicorn

        from .app import create_app, routes
        from .limits import Guard, protocol_class

        app = create_app(self)
        lim = self.limits
        return uvicorn.Config(Guard(app, self, routes(app)), http=protocol_class(lim.header_timeout_s, lim.linger_s, lim.max_connections),
                              lifespan="off", log_level=log_level, access_log=log_level == "info",
                              timeout_keep_alive=lim.keep_alive_s, backlog=lim.backlog, timeout_graceful_shutdown=10, h11_max_incomplete_event_size=16 << 10)

    def serve(self, log_level: str = "info") -> None:
        """Serve until :meth:`close` (or SIGINT / SIGTERM in the main thread); then stop the engine thread and
        release sharded serving's other ranks."""
        import uvicorn

        server = self

        class _Uvicorn(uvicorn.Server):
            async def startup(self, sockets=None) -> None:
                await super().startup(sockets)
                server._up.set()

            async def shutdown(self, sockets=None) -> None:
                server.loop.stop()  # first: requests still running end with an error, so their handlers return
                await super().shutdown(sockets)

        self._uvicorn = _Uvicorn(self._config(log_level))
        self.loop.on_broken = self._exit
        self.loop.start()
        try:
            asyncio.run(self._uvicorn.serve(sockets=[self.socket]))
        finally:
            self._up.set()
            self.loop.stop()
            self.loop.join(timeout=30)
            if self.ctrl is not None and self.loop.error is None:  # sharded serving: release the other ranks
                from ..distributed import stop_workers

                stop_workers(self.ctrl)
        if self.loop.error is not None:  # the engine broke (a rank lost): the server stops with its error
            raise self.loop.error

    def _exit(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    def start_background(self) -> threading.Thread:
        """Serve from a background thread (tests, benchmarks, notebooks), ready when this returns."""
        t = self._background = threading.Thread(target=self.serve, args=("warning",), name="quantkit-http", daemon=True)
        t.start()
        self._up.wait(timeout=60)
        return t

    def close(self) -> None:
        """Stop a background server and wait for it: the engine thread (open streams end with an error event),
        then the HTTP side (open connections closed); no thread of it is left to run into interpreter exit."""
        if self._background is not None and self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._background.join(timeout=60)
        self.server_close()

    def server_close(self) -> None:
        self.socket.close()
