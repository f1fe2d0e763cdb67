"""Which files a checkpoint may make us read: the one rule for weight files, the index, config.json
and side files (tokenizer, chat template, README, ...).

A file is read only if
  1. its name, as the index or the directory listing gives it, stays inside the checkpoint
     directory (relative, and no ``..`` that climbs out), and
  2. the file it resolves to (after every symlink) lies inside the checkpoint directory (resolved),
     or inside the ``blobs/`` folder of the same Hugging Face cache repository: a snapshot
     ``<cache>/models--org--name/snapshots/<rev>/`` holds symlinks ``../../blobs/<hash>``, the
     cache's own layout, which must keep working.
Anything else is refused for weights, the index and config.json (a decoy outside the checkpoint
must never be what gets converted), and skipped and reported for side files (a symlinked
``~/.ssh/id_rsa`` must not end up in an output as its README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

RULE = ("files must lie inside the checkpoint directory (Hugging Face cache links into the same "
        "repository's blobs/ are fine)")


def hf_blobs(root: Path) -> Path | None:
    """The ``blobs/`` folder of the HF cache repository whose snapshot holds ``root`` (resolved), else None."""
    for p in (root, *root.parents):
        if p.parent.name == "snapshots" and (p.parent.parent / "blobs").is_dir():
            return (p.parent.parent / "blobs").resolve()
    return None


def _within(p: Path, top: Path) -> bool:
    return p == top or top in p.parents


def outside_reason(root: Path, path: Path) -> str | None:
    """Why ``path`` (a file named under checkpoint ``root``) may not be read, or None when it may.

    ``root`` must be resolved (what the checkpoint directory really is); ``path`` is the name as
    given, joined onto a folder of the checkpoint (``root`` or ``root/original``)."""
    rel = os.path.relpath(os.path.normpath(os.path.abspath(path)), os.path.abspath(root))
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return f"its name leaves the checkpoint directory {root}"
    real = path.resolve()
    if _within(real, root):
        return None
    blobs = hf_blobs(root)
    if blobs is not None and _within(real, blobs):
        return None
    return f"it resolves to {real}, outside the checkpoint directory {root}"
