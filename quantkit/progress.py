"""Progress of long commands on stderr, one rule for every command (synth, convert, shard, eval):

* ``bar``: a tqdm bar, when stderr is a terminal;
* ``lines``: otherwise (a log file, a pipe, CI): one line every ``EVERY_S`` seconds while the work
  runs, and a last one at the end of work that printed any, so a log shows progress without a
  bar's carriage returns and a short run prints nothing;
* ``off``: ``--quiet``.

The command line decides the style (:func:`style`: only it knows what stderr is and what the user
asked for); library functions take the style as a plain argument and report through
:class:`Progress`.  Results go to stdout, never here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

STYLES = ("bar", "lines", "off")
EVERY_S = 5.0  # seconds between two progress lines off a terminal


def style(quiet: bool = False, stream: TextIO | None = None) -> str:
    """The style for a command's stderr (``stream``, default sys.stderr): off with --quiet, a bar on a terminal, lines otherwise."""
    if quiet:
        return "off"
    s = stream if stream is not None else sys.stderr
    return "bar" if hasattr(s, "isatty") and s.isatty() else "lines"


def _amount(n: float, unit: str) -> str:
    if unit == "B":
        from tqdm import tqdm

        return tqdm.format_sizeof(n, suffix="B", divisor=1000)
    return f"{n:.0f} {unit}s" if n != 1 else f"1 {unit}"


class Progress:
    """Work done out of ``total`` (in ``unit``: "B" prints sizes), shown as ``style`` says on ``stream``.

    ``update(n)`` adds work done, ``reset(total)`` starts over with a new total (known after planning);
    use it as a context manager, or call ``close()``."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "B", style: str = "off", every: float = EVERY_S,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if style not in STYLES:
            raise ValueError(f"progress style must be one of {', '.join(STYLES)}, not {style!r}")
        self.desc, self.total, self.unit, self.style, self.every = desc, total, unit, style, every
        self.stream = stream if stream is not None else sys.stderr
        self.clock, self.done, self.printed = clock, 0, 0
        self.start = self.last = clock()
        self.bar = None
        if style == "bar":
            from tqdm import tqdm

            # delay: no bar for work that ends within half a second (a refused input prints its error alone)
            self.bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1000, file=self.stream,
                            leave=False, delay=0.5)

    def reset(self, total: int | None) -> None:
        self.total, self.done = total, 0
        if self.bar is not None:
            self.bar.reset(total=total)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.style == "lines" and self.clock() - self.last >= self.every:
            self._line()

    def _line(self, end: str = "") -> None:
        now = self.clock()
        of = ""
        if self.total:
            of = f" of {_amount(self.total, self.unit)} ({100 * self.done / self.total:.0f}%)"
        print(f"{self.desc}: {_amount(self.done, self.unit)}{of}, {now - self.start:.0f} s{end}", file=self.stream, flush=True)
        self.last, self.printed = now, self.printed + 1

    def close(self, ok: bool = True) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.style == "lines" and self.printed:
            self._line(", done" if ok else ", stopped")
            self.printed = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(ok=exc_type is None)
