"""Peak anonymous resident memory (RssAnon in /proc/self/status: heap and anonymous maps, not the
mmapped source pages, which are page cache) sampled by a background thread and at explicit points."""

from __future__ import annotations

import threading
from pathlib import Path

STATUS = Path("/proc/self/status")


def rss_anon() -> int:
    """Current RssAnon in bytes (0 where /proc is not available)."""
    try:
        text = STATUS.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """``with RssSampler() as s: ...`` -> s.base (at entry) and s.peak (max seen), in bytes."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.base = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        self.peak = max(self.peak, rss_anon())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "RssSampler":
        self.base = rss_anon()
        self.peak = self.base
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
