"""Source-hash benchmark: one file hashed as one sha256 (the scheme before sha256-tree-64MiB) and as the tree.

    quantkit bench hash --file /tmp/h.bin [--gb 1.5] [--threads 1 2 0] [--repeat 3] [--out OUT]

Writes ``--gb`` GB of random bytes to ``--file`` if it is missing or has another size, reads it once so it is
in the page cache, then per row: wall seconds and CPU seconds (user + system of this process, every thread)
of the best of ``--repeat`` runs.  ``sha256``: one hashlib.sha256 over the file through a read-only map in
16 MiB updates (the removed ``sha256_mapped``).  ``tree xN``: quantkit.converters.provenance.TreeHasher
with N threads (0 = one per usable core).  Prints the load average before each row (the machine may be shared);
with ``--out``, one record per row to OUT/results.jsonl (:mod:`.record`).
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import time
from pathlib import Path


def sha256_plain(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        with memoryview(mm) as view:
            for a in range(0, len(mm), 1 << 24):
                h.update(view[a : a + (1 << 24)])
    return h.hexdigest()


def timed(fn, repeat: int) -> tuple[float, float]:
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - w0, time.process_time() - c0))
    return best


def main(argv: list[str]) -> None:
    from quantkit.converters.provenance import TreeHasher, usable_cores

    from . import prog
    from .env import environment
    from .record import Run

    ap = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, required=True)
    ap.add_argument("--gb", type=float, default=1.5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="directory for results.jsonl")
    a = ap.parse_args(argv)
    run = Run.start(__name__, argv, environment("cpu"))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    size = int(a.gb * 1e9)
    if not a.file.exists() or a.file.stat().st_size != size:
        with open(a.file, "wb") as f:
            for n in range(0, size, 1 << 26):
                f.write(os.urandom(min(1 << 26, size - n)))
    a.file.read_bytes()  # into the page cache
    print(f"{size / 1e9:.2f} GB, {usable_cores()} usable cores\n\n| hash | threads | wall s | CPU s | GB/s | load avg |\n|---|---|---|---|---|---|")
    rows = [("sha256", 1, lambda: sha256_plain(a.file))]
    for t in a.threads:
        def tree(t=t) -> str:
            h = TreeHasher(t or None)
            try:
                return h.digest(a.file)
            finally:
                h.close()
        rows.append(("sha256-tree-64MiB", t or usable_cores(), tree))
    for name, t, fn in rows:
        load = os.getloadavg()[0]
        wall, cpu = timed(fn, a.repeat)
        print(f"| {name} | {t} | {wall:.2f} | {cpu:.2f} | {size / 1e9 / wall:.2f} | {load:.1f} |")
        if a.out:
            row = {"hash": name, "threads": t, "gb": size / 1e9, "wall_s": wall, "cpu_s": cpu, "gbs": size / 1e9 / wall, "load_avg": load}
            run.write(a.out / "results.jsonl", row, ("hash", "threads"))
