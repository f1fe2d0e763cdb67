"""The HTTP front: a process of its own that runs uvicorn and the FastAPI application (:mod:`.app`) over the
listening socket the engine's process bound, and talks to the engine over a local socket (:mod:`.client`).

Started by :class:`.Server` as ``python -m quantkit.serve.server.front LISTEN_FD ENGINE_FD`` (both inherited);
its first message on the engine socket is its configuration (:class:`Config`).  It answers ``("ready",)``
once it listens.  It stops on SIGINT / SIGTERM (uvicorn's), when the engine process goes away or breaks, and
on the engine's ``("stop",)``; requests still running then end with an error, so their handlers return.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from .limits import Limits


@dataclass
class Config:
    """What the front needs of the engine's process (pickled to it at start)."""

    root: str  # the checkpoint: its tokenizer and chat template
    model_config: dict
    model_name: str
    limits: Limits
    max_model_len: int
    vocab_size: int
    started: int
    api_key: str | None
    log_level: str


class Front:
    """What the application reads (:func:`.app.create_app`): the model's text, names, limits and the engine."""

    def __init__(self, cfg: Config, conn: Connection) -> None:
        from ..text import ModelText

        self.cfg, self.conn = cfg, conn
        self.text = ModelText(Path(cfg.root), cfg.model_config)
        self.model_name, self.limits, self.api_key, self.started = cfg.model_name, cfg.limits, cfg.api_key, cfg.started
        self.max_model_len, self.vocab_size = cfg.max_model_len, cfg.vocab_size
        self.loop = None  # the EngineClient, made on the event loop

    def set_api_key(self, key: str | None) -> None:
        self.api_key = key  # read by the Guard at each request head
        self.loop.send(("api_key_set",))

    def run(self, sock: socket.socket) -> None:
        import anyio._backends._asyncio  # noqa: F401 (anyio imports it at a first stream: under EMFILE that import failed, a 500 each)
        import uvicorn

        from .app import create_app, routes
        from .client import EngineClient
        from .limits import Guard, protocol_class

        front, lim = self, self.limits

        class _Uvicorn(uvicorn.Server):
            async def startup(self, sockets=None) -> None:
                front.loop = EngineClient(front.conn, asyncio.get_running_loop())
                front.loop.on_gone = lambda: setattr(self, "should_exit", True)
                front.loop.on_api_key = front.set_api_key
                front.loop.start()
                await super().startup(sockets)
                front.loop.send(("ready",))

            async def shutdown(self, sockets=None) -> None:
                front.loop.stop()  # first: requests still running end with an error, so their handlers return
                await super().shutdown(sockets)

        app = create_app(self)
        config = uvicorn.Config(Guard(app, self, routes(app)), http=protocol_class(lim.header_timeout_s, lim.linger_s, lim.max_connections),
                                lifespan="off", log_level=self.cfg.log_level, access_log=self.cfg.log_level == "info",
                                timeout_keep_alive=lim.keep_alive_s, backlog=lim.backlog, timeout_graceful_shutdown=10,
                                h11_max_incomplete_event_size=16 << 10)  # fmt: skip
        asyncio.run(_Uvicorn(config).serve(sockets=[sock]))


def main(argv: list[str]) -> None:
    listen_fd, engine_fd = int(argv[0]), int(argv[1])
    conn = Connection(engine_fd)
    cfg: Config = conn.recv()
    sock = socket.socket(fileno=listen_fd)
    try:
        Front(cfg, conn).run(sock)
    finally:
        sock.close()
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])
