"""Background consumers for a stream of byte buffers: each buffer goes to every consumer (e.g. a
file's ``write`` and a sha256's ``update``), each consumer in its own thread, in order.

Both consumers release the GIL on large buffers (file writes; hashlib above 2 KiB), so they run
in parallel with each other and with the producer, which computes the next buffer meanwhile.
Memory stays bounded: each buffer is ``put`` with the bytes it owns (0 for a view of a mapped
file, which is page cache), and ``put`` waits while the owned bytes not yet consumed by every
consumer would exceed ``budget`` -- unless nothing is in flight, so one buffer larger than the
budget still passes.  The first consumer error is raised in the producer at its next ``put`` or
at exit; buffers queued after it are dropped unconsumed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

_STOP = object()


class Sink:
    """``with Sink([f.write, h.update], budget) as s: s.put(buf, owned)`` -- exits once every buffer is consumed."""

    def __init__(self, consumers: Sequence[Callable[[Any], Any]], budget: int) -> None:
        self.budget = budget
        self.inflight = 0  # owned bytes of buffers some consumer has not finished
        self.cond = threading.Condition()
        self.errors: list[BaseException] = []
        self.queues: list[queue.Queue] = [queue.Queue() for _ in consumers]
        self.threads = [threading.Thread(target=self._run, args=(fn, q), daemon=True) for fn, q in zip(consumers, self.queues)]

    def _run(self, fn: Callable[[Any], Any], q: queue.Queue) -> None:
        while (item := q.get()) is not _STOP:
            buf, ticket = item
            if not self.errors:
                try:
                    fn(buf)
                except BaseException as e:  # noqa: BLE001  (re-raised in the producer)
                    self.errors.append(e)
            del buf, item
            self._done(ticket)

    def _done(self, ticket: list[int]) -> None:
        with self.cond:
            ticket[0] -= 1  # consumers left
            if ticket[0] == 0:
                self.inflight -= ticket[1]
                self.cond.notify_all()

    def _raise(self) -> None:
        if self.errors:
            raise self.errors[0]

    def put(self, buf: Any, owned: int) -> None:
        """Queue ``buf`` for every consumer; ``owned``: the bytes it holds in memory (0 for a file map's view)."""
        self._raise()
        with self.cond:
            self.cond.wait_for(lambda: self.inflight == 0 or self.inflight + owned <= self.budget or bool(self.errors))
            self.inflight += owned
        ticket = [len(self.queues), owned]
        for q in self.queues:
            q.put((buf, ticket))

    def __enter__(self) -> "Sink":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        for q in self.queues:
            q.put(_STOP)
        for t in self.threads:
            t.join()
        if exc_type is None:
            self._raise()
