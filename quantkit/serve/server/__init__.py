"""``quantkit serve``'s HTTP side: an OpenAI-compatible server over :class:`..scheduler.LLMEngine`, FastAPI on
uvicorn.

Two processes, as vLLM splits its API server from its engine core: this one holds the model and the KV cache,
and its engine thread steps the continuous batch (:mod:`.engine_loop`); the HTTP front, a process of its own
(:mod:`.front`), runs uvicorn's event loop and the application (:mod:`.app`) behind limits that hold before
a body is read (:mod:`.limits`), tokenizes requests and writes replies and streams (:mod:`.streaming`).  They
share no interpreter lock: the engine's host work per step and the front's per-token work run side by side.  Endpoints: ``POST /v1/completions``,
``POST /v1/chat/completions`` (each with ``"stream": true`` as server-sent events), vLLM's
``POST /tokenize``, ``/detokenize`` and ``GET /tokenizer_info``, ``GET /v1/models``, ``/health``,
``/version``, ``/metrics`` (Prometheus text).

fastapi, uvicorn and pydantic (the ``serve`` extra) are imported by this package alone: the engine and
sharded serving's other ranks run without them.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

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
    """Bound at construction (``--port 0`` picks a port, :attr:`url` names it); :meth:`serve` runs it from this
    thread (the front's process started, the engine stepped in a thread of this one), :meth:`start_background`
    from another, :meth:`close` stops either."""

    def __init__(self, address: tuple[str, int], engine: LLMEngine, text: ModelText, model_name: str,
                 limits: Limits | None = None) -> None:
        from .engine_loop import EngineLoop

        self.engine, self.text, self.model_name = engine, text, model_name
        self.limits = limits or Limits()
        self.loop = EngineLoop(engine, self.limits.max_waiting_seqs, text)
        self.started = int(time.time())
        self.ctrl = None  # the control group of sharded serving (rank 0 broadcasts each step on it)
        self._api_key: str | None = None  # when set, /v1/* asks for "Authorization: Bearer <key>"
        _allow_open_files(self.limits.max_connections)
        import fastapi  # noqa: F401  (before the socket listens: an install that cannot import it fails here, not its clients)

        self.socket = _listen(address, self.limits.backlog)
        self.server_address = self.socket.getsockname()[:2]
        self.front: subprocess.Popen | None = None
        self._background: threading.Thread | None = None
        self._up = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def api_key(self) -> str | None:
        return self._api_key

    @api_key.setter
    def api_key(self, key: str | None) -> None:
        self._api_key = key
        if self.front is not None and self.front.poll() is None:
            self.loop.send(("api_key", key))

    def _start_front(self, log_level: str) -> None:
        from .front import Config

        ours, theirs = socket.socketpair()
        listen = self.socket.fileno()
        self.front = subprocess.Popen([sys.executable, "-m", "quantkit.serve.server.front", str(listen), str(theirs.fileno())],
                                      pass_fds=(listen, theirs.fileno()))  # fmt: skip
        theirs.close()
        self.loop.conn = Connection(ours.detach())
        eng = self.engine
        self.loop.send(Config(str(self.text.root), eng.model.config, self.model_name, self.limits, eng.max_model_len,
                              eng.vocab_size, self.started, self._api_key, log_level))  # fmt: skip

    def serve(self, log_level: str = "info") -> None:
        """Serve until :meth:`close`, SIGINT / SIGTERM, or the front's exit; then stop the engine thread and
        release sharded serving's other ranks."""
        self._start_front(log_level)
        self.loop.on_ready = self._up.set
        self.loop.on_broken = self._stop_front
        self.loop.start()
        try:
            self._wait_front()
        finally:
            self._up.set()
            self.loop.stop()
            self.loop.join(timeout=30)
            self.loop.conn.close()
            if self.ctrl is not None and self.loop.error is None:  # sharded serving: release the other ranks
                from ..distributed import stop_workers

                stop_workers(self.ctrl)
        if self.loop.error is not None:  # the engine broke (a rank lost): the server stops with its error
            raise self.loop.error
        if self.front.returncode != 0:
            raise RuntimeError(f"the HTTP front exited with status {self.front.returncode} (its error is above)")

    def _wait_front(self) -> None:
        """Until the front exits; interrupted (Ctrl-C reaches both processes, SIGTERM this one), it is stopped as
        uvicorn stops: open streams end with an error event, connections close, within its graceful timeout."""
        try:
            self.front.wait()
        except KeyboardInterrupt:
            self._stop_front()
            try:
                self.front.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.front.kill()
            raise

    def _stop_front(self) -> None:
        if self.front is not None and self.front.poll() is None:
            self.front.send_signal(signal.SIGTERM)

    def start_background(self) -> threading.Thread:
        """Serve from a background thread (tests, benchmarks, notebooks), ready when this returns."""
        t = self._background = threading.Thread(target=self.serve, args=("warning",), name="quantkit-http", daemon=True)
        t.start()
        self._up.wait(timeout=120)
        if self.front is None or self.front.poll() is not None:
            raise RuntimeError(f"the HTTP front did not start (exit status {None if self.front is None else self.front.returncode})")
        return t

    def close(self) -> None:
        """Stop a background server and wait for it: the front (open streams end with an error event, open
        connections closed), then the engine thread; no thread or process of it is left."""
        if self._background is not None:
            self._stop_front()
            self._background.join(timeout=60)
        self.server_close()

    def server_close(self) -> None:
        self.socket.close()
