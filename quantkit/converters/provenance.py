"""What a conversion was made from: the sha256 of every source file's bytes.

The source fingerprint (sha256 over each weight file's name, size and header) identifies a source
quickly but proves nothing about its tensor bytes: a fixed or re-downloaded shard keeps its header.
So ``convert`` hashes every source weight file once, records the digests in ``quantkit.json``
(``source.files``, algorithm in ``source.file_hash``) and, per output shard, in ``progress.json``
(``made_from``: the digests of the source files that shard read).  ``--resume`` hashes the source
again and keeps an output shard only if every source file it read has the same digest; the others
are converted again.

Files are hashed in parallel threads (hashlib releases the GIL on large buffers), while the worker
processes are not running yet, so hashing takes the machine's cores for itself.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..checkpoint import sha256_file
from .plan import Plan

FILE_HASH = "sha256"


def hash_files(paths: dict[str, str]) -> dict[str, str]:
    """name -> sha256 of the file at ``paths[name]``, files hashed in parallel."""
    names = sorted(paths)
    threads = max(1, min(len(names), os.cpu_count() or 1))
    with ThreadPoolExecutor(threads) as ex:
        digests = list(ex.map(lambda n: sha256_file(Path(paths[n])), names))
    return dict(zip(names, digests))


def shard_sources(plan: Plan, digests: dict[str, str]) -> dict[str, dict[str, str]]:
    """Per output shard, the digest of each source file its tensors are read from."""
    return {sh.file: {f: digests[f] for f in plan.shard_sources(i)} for i, sh in enumerate(plan.shards)}
