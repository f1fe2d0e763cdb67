"""Writing checkpoint directories: streaming shard writes and the atomic commit.

The tensor list is planned first (:func:`plan_shards`), so each shard's header is known before its
data; tensors are then streamed into ``<name>.part`` files one at a time, so memory is bounded by the
largest tensor.  Everything goes into a hidden sibling directory ``.<dst>.quantkit-partial`` that is
renamed onto ``dst`` at the end (what may be replaced, and the lock per DST: :mod:`.destination`);
``progress.json`` there lets ``--resume`` keep the shards whose sha256 matches and whose source
files are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import __version__, destination
from .checkpoint import DTYPE_NAMES, INDEX, MANIFEST, PROGRESS, Checkpoint, CheckpointError
from .sink import Sink


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


@dataclass
class ShardPlan:
    file: str
    specs: list[TensorSpec] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def header(self) -> bytes:
        entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
        pos = 0
        for s in self.specs:
            entries[s.name] = {"dtype": DTYPE_NAMES[s.dtype], "shape": list(s.shape), "data_offsets": [pos, pos + s.nbytes]}
            pos += s.nbytes
        raw = json.dumps(entries, separators=(",", ":")).encode()
        raw += b" " * ((-len(raw)) % 8)  # safetensors pads the header to 8 bytes
        return struct.pack("<Q", len(raw)) + raw


def plan_shards(specs: Iterable[TensorSpec], max_shard_size: int) -> list[ShardPlan]:
    """Greedy, order-preserving split into shards of at most ``max_shard_size`` bytes (a tensor larger than that gets its own)."""
    shards: list[ShardPlan] = [ShardPlan("")]
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise CheckpointError(f"tensor {s.name!r} planned twice")
        seen.add(s.name)
        cur = shards[-1]
        if cur.specs and cur.nbytes + s.nbytes > max_shard_size:
            shards.append(cur := ShardPlan(""))
        cur.specs.append(s)
    n = len(shards)
    for i, sh in enumerate(shards):
        sh.file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    return shards


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy when it already is a contiguous CPU tensor."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    return memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else memoryview(b"")


SINK_MIN_BUDGET = 1 << 20  # owned bytes the writer threads may lag behind, at least (small: memory is bounded by the largest tensor)


def write_shard(path: Path, plan: ShardPlan, tensors: Iterator[torch.Tensor], borrowed: Collection[str] = ()) -> str:
    """Stream ``tensors`` (in plan order) into ``path`` via ``path.part``; return the file's sha256.

    Writing and hashing run in background threads (:class:`~quantkit.sink.Sink`) while the next
    tensor is produced; the bytes and their order are the plan's, whatever the timing.
    ``borrowed``: names of tensors that are views of mapped files (page cache, not process memory),
    which may queue up freely; the others may lag by max(largest of them, SINK_MIN_BUDGET) bytes,
    so memory stays within about twice the largest tensor."""
    h = hashlib.sha256()
    part = path.with_name(path.name + ".part")
    owned = [s.nbytes for s in plan.specs if s.name not in borrowed]
    try:
        with open(part, "wb") as f, Sink([f.write, h.update], budget=max([SINK_MIN_BUDGET, *owned])) as sink:
            head = plan.header()
            sink.put(head, len(head))
            for spec in plan.specs:
                t = next(tensors)
                if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
                    raise CheckpointError(f"{path.name}: tensor {spec.name!r} is {t.dtype}{tuple(t.shape)}, planned {spec.dtype}{spec.shape}")
                sink.put(tensor_bytes(t), 0 if spec.name in borrowed else spec.nbytes)
                del t
    except BaseException:
        part.unlink(missing_ok=True)  # a half-written .part is never resumed: do not leave it (a full disk stays full)
        raise
    os.replace(part, path)
    return h.hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


class CheckpointWriter:
    """Atomic writer of a checkpoint directory: everything lands in a partial sibling, renamed at the end."""

    def __init__(self, dst: str | Path, *, force: bool = False, resume: bool = False, job: dict | None = None,
                 command: str = "quantkit", sources: Mapping[str, dict[str, str]] | None = None,
                 file_hash: str | None = None) -> None:
        """``sources.get(file, {})``: the digest of each source file output ``file`` is made from (may wait
        for them), in scheme ``file_hash``; --resume keeps a file only if these are the same now (headers
        alone prove nothing: a fixed shard keeps its header).  An interrupted run that recorded another
        scheme, or none (plain sha256, before schemes were named), cannot be compared: all its files are redone."""
        self.dst = destination.named(dst)  # a symlink DST is the link itself (quantkit/destination.py)
        self.tmp = destination.sibling(self.dst, "partial")
        self.force = force
        self.job = job or {}
        self.sources = sources or {}
        self.file_hash = file_hash
        self.done: dict[str, str] = {}
        self.made_from: dict[str, dict[str, str]] = {}
        self.stale: list[str] = []  # files of the interrupted run redone because a source file they read changed
        self.other_scheme: list[str] = []  # ... because it recorded its source digests in another scheme
        try:
            self.lock = destination.Lock(self.dst, command)
        except destination.DestinationError as e:
            raise CheckpointError(str(e)) from None
        try:
            if destination.occupied(self.dst) and not force:
                raise CheckpointError(f"{self.dst} already exists: pass --force to replace it (it is {destination.kind(self.dst)})")
            if resume and self.tmp.is_dir():
                self._resume()
            else:
                self._start()
        except BaseException:
            self.lock.release()
            raise

    def _start(self) -> None:
        if destination.occupied(self.tmp):
            destination.remove(self.tmp)
        try:
            self.tmp.mkdir(parents=True)
            self._save_progress()
        except BaseException:  # e.g. a disk already full: leave no partial directory behind
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def _resume(self) -> None:
        prog = self.tmp / PROGRESS
        state = json.loads(prog.read_text()) if prog.exists() else {}
        if state.get("job") != self.job:
            raise CheckpointError(f"{self.tmp}: the interrupted run used other inputs or options; run without --resume (or with --force) to start over")
        made_from = state.get("made_from", {})
        comparable = state.get("file_hash") == self.file_hash  # digests of two schemes never match, whatever the bytes
        for fname, digest in state.get("files", {}).items():
            if not comparable:
                self.other_scheme.append(fname)
            elif made_from.get(fname, {}) != self.sources.get(fname, {}):
                self.stale.append(fname)
            elif (self.tmp / fname).exists() and sha256_file(self.tmp / fname) == digest:
                self.done[fname] = digest
                self.made_from[fname] = made_from.get(fname, {})

    def _save_progress(self) -> None:
        tmp = self.tmp / (PROGRESS + ".tmp")
        tmp.write_text(json.dumps({"job": self.job, "file_hash": self.file_hash, "files": self.done,
                                   "made_from": self.made_from}, indent=1))
        os.replace(tmp, self.tmp / PROGRESS)

    def is_done(self, fname: str) -> bool:
        return fname in self.done

    def shard_path(self, fname: str) -> Path:
        return self.tmp / fname

    def record(self, fname: str, digest: str) -> None:
        self.done[fname] = digest
        self.made_from[fname] = self.sources.get(fname, {})
        self._save_progress()

    def write(self, plan: ShardPlan, tensors: Iterator[torch.Tensor]) -> None:
        if not self.is_done(plan.file):
            self.record(plan.file, write_shard(self.shard_path(plan.file), plan, tensors))

    def put_json(self, name: str, obj: dict) -> None:
        (self.tmp / name).write_text(json.dumps(obj, indent=2) + "\n")

    def copy_side_files(self, src: Checkpoint) -> None:
        for p in src.side_files():
            shutil.copy2(p, self.tmp / p.name)

    def finish(self, plans: list[ShardPlan], config: dict, manifest: dict, weights_dir: str = "") -> Path:
        """Write index, config and quantkit.json, then commit by rename.

        ``weights_dir``: the shards live in that subfolder (their ``file`` starts with it, e.g.
        GPT-OSS's ``original/``); the index goes beside them, config.json stays at the root."""
        missing = [p.file for p in plans if p.file not in self.done]
        if missing:
            raise CheckpointError(f"{self.dst}: shards not written: {', '.join(missing)}")
        prefix = f"{weights_dir}/" if weights_dir else ""
        index = {
            "metadata": {"total_size": sum(p.nbytes for p in plans)},
            "weight_map": {s.name: p.file.removeprefix(prefix) for p in plans for s in p.specs},
        }
        self.put_json(prefix + INDEX, index)
        self.put_json("config.json", config)
        files = {p.file: self.done[p.file] for p in plans}
        for p in sorted(self.tmp.rglob("*")):
            rel = p.relative_to(self.tmp).as_posix()
            if p.is_file() and rel not in files and rel != PROGRESS:
                files[rel] = sha256_file(p)
        manifest = {"quantkit_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **manifest, "files": dict(sorted(files.items()))}
        self.put_json(MANIFEST, manifest)
        (self.tmp / PROGRESS).unlink()
        return self._commit()

    def commit(self) -> Path:
        """Commit the partial directory as the caller laid it out (e.g. shard's rank directories with their own indexes)."""
        (self.tmp / PROGRESS).unlink(missing_ok=True)
        return self._commit()

    def _commit(self) -> Path:
        if destination.occupied(self.dst) and not self.force:
            raise CheckpointError(f"{self.dst} appeared while writing: pass --force to replace it")
        destination.replace(self.tmp, self.dst)
        self.close()
        return self.dst

    def abort(self) -> None:
        """Remove the partial directory (a failed run that cannot be resumed leaves nothing)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.close()

    def close(self) -> None:
        """Release the DST lock (idempotent); the partial directory, if any, stays for --resume."""
        self.lock.release()
