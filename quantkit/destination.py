"""Rules for a command's destination DST: what may be replaced, and one writer at a time.

* DST is taken as named, never through a symlink: a DST that is a symlink (to a directory, to a
  file, or to nothing) or a regular file is refused without ``--force``; with ``--force`` the link
  or file itself is replaced by the new output directory once it is complete, and what a link
  pointed to is left untouched.  An existing DST directory is replaced the same way.
* The old DST is first renamed to the sibling ``.DST.quantkit-old`` and removed after the new one
  is in place; a leftover ``.DST.quantkit-old`` (a run killed in between) is removed first, so
  every later ``--force`` run still works.
* A lock per DST: ``.DST.quantkit-lock`` beside DST, held with ``flock`` for the whole run and
  naming its holder (pid, host, command, start time).  A second run on the same DST is refused with
  that name before it touches the partial directory.  The kernel drops a ``flock`` when its holder
  dies (even by SIGKILL), so a lock file left by a dead process is simply taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path


class DestinationError(ValueError):
    """DST cannot be written: the message names it and the rule (a CheckpointError subclass wraps it)."""


def named(dst: str | Path) -> Path:
    """DST as an absolute path without resolving its last component (a symlink DST stays the link)."""
    return Path(os.path.abspath(dst))


def occupied(p: Path) -> bool:
    """Something is at ``p``: a directory, a file, or a symlink (dangling ones too)."""
    return os.path.lexists(p)


def kind(p: Path) -> str:
    if p.is_symlink():
        return "a symlink" if p.exists() else "a dangling symlink"
    return "a directory" if p.is_dir() else "a file"


def remove(p: Path) -> None:
    """Remove what is at ``p``: a link or file is unlinked (never followed), a directory removed with its contents."""
    if p.is_symlink() or not p.is_dir():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p)


def sibling(dst: Path, what: str) -> Path:
    return dst.parent / f".{dst.name}.quantkit-{what}"


def replace(tmp: Path, dst: Path) -> None:
    """Rename the finished ``tmp`` onto ``dst``, moving whatever is at ``dst`` aside first and removing it after."""
    old = sibling(dst, "old")
    if occupied(old):
        remove(old)
    had = occupied(dst)
    if had:
        os.replace(dst, old)  # renames a link or file itself, never its target
    os.replace(tmp, dst)
    if had:
        remove(old)


def _holder(command: str) -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                       "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def _describe(raw: str) -> str:
    try:
        h = json.loads(raw)
        return f"pid {h['pid']} on {h['host']} ({h['command']}, since {h['since']})"
    except (ValueError, KeyError, TypeError):
        return "a process that did not say who it is"


class Lock:
    """``flock`` on ``.DST.quantkit-lock``; :meth:`release` removes the file."""

    def __init__(self, dst: Path, command: str) -> None:
        self.path = sibling(dst, "lock")
        self.dst = dst
        self.fd: int | None = None
        self.took_over = ""  # the holder a dead process's lock file named, if one was left
        self._acquire(command)

    def _acquire(self, command: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # the file may be removed between our open and our flock: then try again
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode(errors="replace")
                os.close(fd)
                raise DestinationError(f"{self.dst}: another run is writing it: {_describe(holder)}; "
                                       f"lock {self.path} (one run per DST: wait for it, or stop it)") from None
            if os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                break
            os.close(fd)
        else:
            raise DestinationError(f"{self.path}: could not take the lock (it keeps being replaced)")
        left = os.read(fd, 4096).decode(errors="replace")
        self.took_over = _describe(left) if left else ""
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder(command).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still held: a waiting run then opens a new file
        os.close(self.fd)
        self.fd = None


def disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno == errno.ENOSPC


def disk_full_message(where: Path, needed: int, kept: Path | None) -> str:
    """One line for a full disk: the directory, the bytes still to write, and what was kept."""
    free = shutil.disk_usage(where).free if where.exists() else 0
    tail = (f"the partial output {kept} is kept: free space and run the same command with --resume" if kept
            else "nothing was kept: free space and run it again")
    return f"{where}: no space left on device: {needed:,} bytes still to write, {free:,} free; {tail}"
