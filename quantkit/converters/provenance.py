"""What a conversion was made from: the sha256 of every source file's bytes.

The source fingerprint (sha256 over each weight file's name, size and header) identifies a source
quickly but proves nothing about its tensor bytes: a fixed or re-downloaded shard keeps its header.
So ``convert`` hashes every source weight file once, records the digests in ``quantkit.json``
(``source.files``, algorithm in ``source.file_hash``) and, per output shard, in ``progress.json``
(``made_from``: the digests of the source files that shard read).  ``--resume`` hashes the source
again and keeps an output shard only if every source file it read has the same digest; the others
are converted again.

Cost: files are hashed through a read-only map (no copy into a buffer; hashlib releases the GIL),
in background threads that run while the shards are converted; recording a finished shard waits
only for the digests of the files it read.  sha256 is kept (no faster hash is in the standard
library, and the project adds no dependency for this).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .plan import Plan

FILE_HASH = "sha256"
BLOCK = 1 << 24  # bytes per update: large enough that hashlib runs without the GIL


def sha256_mapped(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                for a in range(0, size, BLOCK):
                    h.update(view[a : a + BLOCK])
                view.release()
    return h.hexdigest()


class SourceHashes:
    """sha256 of each source file (name -> path), computed in background threads from construction on."""

    def __init__(self, plan: Plan, threads: int | None = None) -> None:
        self.plan = plan
        names = sorted(plan.source_files)
        self.pool = ThreadPoolExecutor(max(1, min(len(names), threads or os.cpu_count() or 1)))
        self.futures: dict[str, Future[str]] = {n: self.pool.submit(sha256_mapped, Path(plan.source_files[n])) for n in names}
        self.shard_index = {sh.file: i for i, sh in enumerate(plan.shards)}

    def digests(self) -> dict[str, str]:
        """name -> sha256 of every source file (waits for them)."""
        return {n: f.result() for n, f in self.futures.items()}

    def get(self, shard: str, default: dict | None = None) -> dict[str, str]:
        """Digests of the source files output ``shard`` reads (waits for those only)."""
        if shard not in self.shard_index:
            return default or {}
        return {n: self.futures[n].result() for n in self.plan.shard_sources(self.shard_index[shard])}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

