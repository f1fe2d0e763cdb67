"""``quantkit serve``'s HTTP side: an OpenAI-compatible server over :class:`..scheduler.LLMEngine`, FastAPI on
uvicorn.

Processes as vLLM splits its API servers from its engine core: this one holds the model and the KV cache,
and its engine thread steps the continuous batch (:mod:`.engine_loop`); each HTTP front, a process of its own
(:mod:`.front`; ``api_servers`` of them, accepting on one listening socket), runs uvicorn's event loop and the
application (:mod:`.app`) behind limits that hold before a body is read (:mod:`.limits`), tokenizes requests
and writes replies and streams (:mod:`.streaming`).  They share no interpreter lock: the engine's host work
per step and the fronts' per-request and per-token work run side by side.  Endpoints: ``POST /v1/completions``,
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
from dataclasses import replace
from multiprocessing.connection import Connection

from ..scheduler import LLMEngine
from ..text import ModelText
from .limits import Limits

__all__ = ["Limits", "Server"]

STOPPED = (0, -signal.SIGTERM, -signal.SIGINT)  # a front's exit status once stopped (uvicorn re-raises the signal it stopped on)
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
    thread (the fronts' processes started, the engine stepped in a thread of this one), :meth:`start_background`
    from another, :meth:`close` stops either."""

    def __init__(self, address: tuple[str, int], engine: LLMEngine, text: ModelText, model_name: str,
                 limits: Limits | None = None, api_servers: int = 1) -> None:
        """``api_servers``: HTTP front processes, all accepting on the one listening socket (each holds at most
        its share of ``limits.max_connections``)."""
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
        if api_servers < 1:
            raise ValueError(f"api_servers must be at least 1, got {api_servers}")
        self.api_servers = api_servers
        self.fronts: list[subprocess.Popen] = []
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
        if self.fronts and self.loop.is_alive():
            self.loop.set_api_key(key)

    def _start_fronts(self, log_level: str) -> None:
        from .front import Config

        eng, n, listen = self.engine, self.api_servers, self.socket.fileno()
        limits = replace(self.limits, max_connections=-(-self.limits.max_connections // n))
        cfg = Config(str(self.text.root), eng.model.config, self.model_name, limits, eng.max_model_len, eng.vocab_size,
                     self.started, self._api_key, log_level)  # fmt: skip
        for _ in range(n):
            ours, theirs = socket.socketpair()
            self.fronts.append(subprocess.Popen([sys.executable, "-m", "quantkit.serve.server.front", str(listen), str(theirs.fileno())],
                                                pass_fds=(listen, theirs.fileno())))  # fmt: skip
            theirs.close()
            self.loop.conns.append(Connection(ours.detach()))
            self.loop.send(len(self.loop.conns) - 1, cfg)

    def serve(self, log_level: str = "info") -> None:
        """Serve until :meth:`close`, SIGINT / SIGTERM, or a front's exit; then stop the engine thread and
        release sharded serving's other ranks."""
        self._start_fronts(log_level)
        self.loop.on_ready = self._up.set
        self.loop.on_broken = self._stop_fronts
        self.loop.start()
        try:
            self._wait_fronts()
        finally:
            self._up.set()
            self.loop.stop()
            self.loop.join(timeout=30)
            for c in self.loop.conns:
                c.close()
            if self.ctrl is not None and self.loop.error is None:  # sharded serving: release the other ranks
                from ..distributed import stop_workers

                stop_workers(self.ctrl)
        if self.loop.error is not None:  # the engine broke (a rank lost): the server stops with its error
            raise self.loop.error
        failed = [f.returncode for f in self.fronts if f.returncode not in STOPPED]
        if failed:
            raise RuntimeError(f"an HTTP front exited with status {failed[0]} (its error is above)")

    def _wait_fronts(self) -> None:
        """Until every front exits (one that stops, stops the others); interrupted (Ctrl-C reaches every process,
        SIGTERM this one), they are stopped as uvicorn stops: open streams end with an error event, connections
        close, within its graceful timeout."""
        try:
            stopping = False
            while any(f.poll() is None for f in self.fronts):
                if not stopping and any(f.returncode is not None for f in self.fronts):
                    self._stop_fronts()
                    stopping = True
                time.sleep(0.05)
        except KeyboardInterrupt:
            self._stop_fronts()
            for f in self.fronts:
                try:
                    f.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    f.kill()
            raise

    def _stop_fronts(self) -> None:
        for f in self.fronts:
            if f.poll() is None:
                f.send_signal(signal.SIGTERM)

    def start_background(self) -> threading.Thread:
        """Serve from a background thread (tests, benchmarks, notebooks), ready when this returns."""
        t = self._background = threading.Thread(target=self.serve, args=("warning",), name="quantkit-http", daemon=True)
        t.start()
        self._up.wait(timeout=120)
        down = [f.returncode for f in self.fronts if f.poll() is not None]
        if len(self.fronts) < self.api_servers or down:
            raise RuntimeError(f"the HTTP front did not start (exit status {down[0] if down else None})")
        return t

    def close(self) -> None:
        """Stop a background server and wait for it: the front (open streams end with an error event, open
        connections closed), then the engine thread; no thread or process of it is left."""
        if self._background is not None:
            self._stop_fronts()
            self._background.join(timeout=60)
        self.server_close()

    def server_close(self) -> None:
        self.socket.close()
