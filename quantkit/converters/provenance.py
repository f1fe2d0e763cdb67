"""What a conversion was made from: a tree sha256 of every source file's bytes.

The source fingerprint (sha256 over each weight file's name, size and header) identifies a source
quickly but proves nothing about its tensor bytes: a fixed or re-downloaded shard keeps its header.
So ``convert`` hashes every source weight file once, records the digests in ``quantkit.json``
(``source.files``, scheme in ``source.file_hash``) and, per output shard, in ``progress.json``
(``made_from``: the digests of the source files that shard read; ``file_hash``: the scheme).
``--resume`` hashes the source again and keeps an output shard only if every source file it read has
the same digest in the same scheme; the others are converted again.

Scheme ``sha256-tree-64MiB`` (FILE_HASH): the file is cut into 64 MiB leaves (the last one shorter;
an empty file has none), each leaf is hashed with sha256, and the file digest is
``sha256(leaf_0 || leaf_1 || ... || chunk size as 8 bytes little-endian)`` over the raw 32-byte leaf
digests.  With the leaf size fixed, the leaf list determines the bytes, so the digest proves them as
well as one sha256 would.  It is a tree only so that one file can be hashed on every core: a single
sha256 is serial, and one 5 GB file took 2.5-3.5 s on one thread, past the end of a fast conversion.

Cost: each leaf is hashed from its own read-only map (no copy; hashlib releases the GIL), in a thread
pool of one thread per usable core that runs while the shards are converted; recording a finished
shard waits only for the leaves of the files it read.  Measured figures: docs/safety.md.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .plan import Plan

CHUNK = 64 << 20  # bytes per leaf; a multiple of mmap.ALLOCATIONGRANULARITY, so a leaf maps on its own
FILE_HASH = f"sha256-tree-{CHUNK >> 20}MiB"


def leaf_digest(path: Path, offset: int, length: int) -> bytes:
    """sha256 of ``length`` bytes of ``path`` from ``offset``, read through a read-only map of just them."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset) as mm:
        return hashlib.sha256(mm).digest()


def root_digest(leaves: list[bytes]) -> str:
    return hashlib.sha256(b"".join(leaves) + CHUNK.to_bytes(8, "little")).hexdigest()


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class TreeHasher:
    """Hashes files in the FILE_HASH scheme on a pool of threads; leaves are queued in submission order."""

    def __init__(self, threads: int | None = None) -> None:
        self.pool = ThreadPoolExecutor(max(1, threads or usable_cores()))

    def submit(self, path: Path) -> list[Future[bytes]]:
        size = path.stat().st_size
        return [self.pool.submit(leaf_digest, path, a, min(CHUNK, size - a)) for a in range(0, size, CHUNK)]

    def digest(self, path: Path) -> str:
        return root_digest([f.result() for f in self.submit(path)])

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class SourceHashes:
    """FILE_HASH digest of each source file (name -> path), computed in background threads from construction on."""

    def __init__(self, plan: Plan, threads: int | None = None) -> None:
        self.plan = plan
        self.hasher = TreeHasher(threads)
        # files in name order, each file's leaves in order: the engine reads the sources in about this order
        self.leaves = {n: self.hasher.submit(Path(plan.source_files[n])) for n in sorted(plan.source_files)}
        self.shard_index = {sh.file: i for i, sh in enumerate(plan.shards)}

    def _digest(self, name: str) -> str:
        return root_digest([f.result() for f in self.leaves[name]])

    def digests(self) -> dict[str, str]:
        """name -> digest of every source file (waits for them)."""
        return {n: self._digest(n) for n in self.leaves}

    def get(self, shard: str, default: dict | None = None) -> dict[str, str]:
        """Digests of the source files output ``shard`` reads (waits for those only)."""
        if shard not in self.shard_index:
            return default or {}
        return {n: self._digest(n) for n in self.plan.shard_sources(self.shard_index[shard])}

    def close(self) -> None:
        self.hasher.close()
