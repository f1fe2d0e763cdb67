"""HF checkpoint directories: lazy reads through safe_open, streaming shard writes, atomic commit.

Reading: a directory with ``model.safetensors`` or a ``model.safetensors.index.json`` (the index
is trusted for the name -> file map, never the shard names), or GPT-OSS's ``original/`` folder.
Every safetensors header is validated before use (length, JSON, dtypes, offsets that tile the
data region and match the file size), so a truncated or lying file fails with its name.

Writing: the tensor list is planned first (:func:`plan_shards`), so each shard's header is
known before its data; tensors are then streamed into ``<name>.part`` files one at a time, so
memory is bounded by the largest tensor.  Everything goes into a hidden sibling directory
``.<dst>.quantkit-partial`` that is renamed onto ``dst`` at the end (after moving an existing
``dst`` aside when ``--force`` was given); ``progress.json`` there lets ``--resume`` keep the
shards whose sha256 matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import __version__, destination
from .paths import RULE, outside_reason
from .sink import Sink

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MANIFEST = "quantkit.json"
PROGRESS = "progress.json"
MAX_HEADER = 100 * 1024 * 1024

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint breaks a rule; the message names the file or tensor and the rule."""


def itemsize(dtype: str) -> int:
    return DTYPES[dtype].itemsize


def parse_size(s: str | int) -> int:
    """'5GB', '500MiB', '1000000' -> bytes (GB = 1e9, GiB = 2**30)."""
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", s, re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot read size {s!r}: use e.g. 5GB, 500MiB or a byte count")
    base = 1024 if m.group(3) else 1000
    power = " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * base**power)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors tag, e.g. "F8_E4M3"
    shape: tuple[int, ...]
    file: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict[str, object] = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"key {k!r} appears twice")
        seen[k] = v
    return seen


def load_json_object(raw: bytes | str, where: str, what: str) -> dict:
    """``raw`` parsed as one JSON object (no repeated keys); else a CheckpointError naming ``where``."""
    try:
        obj = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError, as is a repeated key
        raise CheckpointError(f"{where}: {what} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: {what} must be a JSON object, not {type(obj).__name__}")
    return obj


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_metadata(path: Path, meta: object) -> None:
    """safetensors' rule: ``__metadata__`` is a map of strings to strings."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: __metadata__ must be an object of strings, not {type(meta).__name__}")
    bad = [k for k, v in meta.items() if not isinstance(v, str)]
    if bad:
        raise CheckpointError(f"{path}: __metadata__ value of {bad[0]!r} is {type(meta[bad[0]]).__name__}; safetensors metadata values are strings")


def _check_entry(path: Path, name: str, e: object) -> tuple[int, int]:
    """One tensor entry of a header: {dtype, shape: [counts], data_offsets: [begin, end]} -> (begin, end)."""
    if not isinstance(e, dict):
        raise CheckpointError(f"{path}: tensor {name!r} entry must be an object with dtype, shape and data_offsets, not {type(e).__name__}")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in e]
    if missing:
        raise CheckpointError(f"{path}: tensor {name!r} has no {missing[0]}")
    if not isinstance(e["dtype"], str) or e["dtype"] not in DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has unknown dtype {e['dtype']!r}; known: {', '.join(DTYPES)}")
    shape = e["shape"]
    if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
        raise CheckpointError(f"{path}: tensor {name!r} shape {shape!r} must be a list of non-negative integers")
    offs = e["data_offsets"]
    if not isinstance(offs, list) or len(offs) != 2 or not all(_is_count(o) for o in offs) or offs[0] > offs[1]:
        raise CheckpointError(f"{path}: tensor {name!r} data_offsets {offs!r} must be [begin, end], integers with 0 <= begin <= end")
    numel = 1
    for s in shape:
        numel *= s
    if offs[1] - offs[0] != numel * itemsize(e["dtype"]):
        raise CheckpointError(f"{path}: tensor {name!r} {e['dtype']}{shape} needs {numel * itemsize(e['dtype'])} bytes, header gives {offs[1] - offs[0]}")
    return offs[0], offs[1]


def read_header(path: Path) -> tuple[dict, bytes]:
    """Validated safetensors header of ``path`` -> (tensor entries, raw header bytes)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header length {n} exceeds the file ({size} bytes): truncated or not safetensors")
        raw = f.read(n)
    header = load_json_object(raw, str(path), "header")
    if "__metadata__" in header:
        _check_metadata(path, header.pop("__metadata__"))
    spans = sorted((*_check_entry(path, name, e), name) for name, e in header.items())
    pos = 0
    for b, end, name in spans:
        if b != pos:
            raise CheckpointError(f"{path}: tensor {name!r} starts at byte {b}, expected {pos}: header offsets do not tile the data")
        pos = end
    if 8 + n + pos != size:
        raise CheckpointError(f"{path}: header describes {8 + n + pos} bytes but the file has {size}: truncated or padded")
    return header, raw


def read_weight_map(idx: Path) -> dict[str, str]:
    """The index's ``weight_map``: an object of tensor name -> shard file name (both strings)."""
    wmap = load_json_object(idx.read_bytes(), str(idx), "the index").get("weight_map")
    if not isinstance(wmap, dict):
        raise CheckpointError(f"{idx}: weight_map must be an object of tensor name -> file name, got {type(wmap).__name__}")
    bad = [k for k, v in wmap.items() if not isinstance(v, str)]
    if bad:
        raise CheckpointError(f"{idx}: weight_map[{bad[0]!r}] is {wmap[bad[0]]!r}; it must be a file name (a string)")
    return wmap


class Checkpoint:
    """Lazy, validated view of an HF checkpoint directory (or its GPT-OSS ``original/`` folder)."""

    def __init__(self, path: str | Path, layout: str = "auto") -> None:
        self.root = Path(path)
        if not self.root.is_dir():
            raise CheckpointError(f"{self.root}: not a checkpoint directory")
        self.dir = self._weights_dir(layout)
        self.layout = "original" if self.dir != self.root else "root"
        self.real = self.root.resolve()
        cfg = self.root / "config.json"
        self.config = self._read_json(self.inside(cfg, "config")) if cfg.exists() else {}
        self._files: dict[str, dict] = {}
        self._raw: dict[str, bytes] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._load_index()
        self._handles: dict[str, object] = {}

    def _weights_dir(self, layout: str) -> Path:
        has_root = any(self.root.glob("*.safetensors"))
        orig = self.root / "original"
        if layout == "original" or (layout == "auto" and not has_root and orig.is_dir()):
            if not any(orig.glob("*.safetensors")):
                raise CheckpointError(f"{orig}: no safetensors files in the original/ layout")
            return orig
        if not has_root:
            raise CheckpointError(f"{self.root}: no *.safetensors files (and no original/ folder)")
        return self.root

    @staticmethod
    def _read_json(p: Path) -> dict:
        return load_json_object(p.read_bytes(), str(p), "the file")

    def inside(self, p: Path, what: str) -> Path:
        """``p`` if the path rule lets us read it, else a CheckpointError naming it and the rule."""
        rel = p.relative_to(self.root) if p.is_relative_to(self.root) else p  # an absolute name stays absolute
        why = outside_reason(self.real, self.real / rel)
        if why is not None:
            raise CheckpointError(f"{p}: refused {what} file: {why} ({RULE})")
        return p

    def _header(self, fname: str) -> dict:
        if fname not in self._files:
            p = self.inside(self.dir / fname, "weight")
            if not p.exists():
                raise CheckpointError(f"{self.dir / INDEX}: points to missing file {fname}")
            self._files[fname], self._raw[fname] = read_header(p)
        return self._files[fname]

    def _load_index(self) -> None:
        idx = self.dir / INDEX
        if idx.exists():
            wmap = read_weight_map(self.inside(idx, "index"))
            for fname in sorted(set(wmap.values())):
                self._header(fname)
            for name, fname in wmap.items():
                e = self._files[fname].get(name)
                if e is None:
                    raise CheckpointError(f"{idx}: tensor {name!r} is mapped to {fname}, which does not hold it")
                self.tensors[name] = TensorInfo(name, e["dtype"], tuple(e["shape"]), fname)
            self._check_files_against(wmap)
        else:
            files = sorted(p.name for p in self.dir.glob("*.safetensors"))
            if len(files) > 1:
                raise CheckpointError(f"{self.dir}: {len(files)} safetensors files but no {INDEX}")
            for name, e in self._header(files[0]).items():
                self.tensors[name] = TensorInfo(name, e["dtype"], tuple(e["shape"]), files[0])

    def _check_files_against(self, wmap: dict[str, str]) -> None:
        """Every tensor a shard holds is listed, and listed for that shard: a name held by two shards
        would be read from whichever the index names, so it is refused."""
        for fname, hdr in self._files.items():
            extra = sorted(set(hdr) - set(wmap))
            if extra:
                raise CheckpointError(f"{self.dir / fname}: holds tensors the index does not list: {', '.join(extra[:5])}")
            twice = sorted(n for n in hdr if wmap[n] != fname)
            if twice:
                raise CheckpointError(f"{self.dir / fname}: tensor {twice[0]!r} is also in {wmap[twice[0]]}: a tensor name may be in one shard only")

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        return list(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.dir}: tensor {name!r} not found") from None

    def get(self, name: str) -> torch.Tensor:
        """Read one tensor (through safe_open's mmap)."""
        from safetensors import safe_open

        fname = self.info(name).file
        if fname not in self._handles:
            self._handles[fname] = safe_open(str(self.dir / fname), framework="pt")
        return self._handles[fname].get_tensor(name)  # type: ignore[attr-defined]

    def files(self) -> list[str]:
        return sorted({t.file for t in self.tensors.values()})

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def fingerprint(self) -> str:
        """sha256 over each weight file's name, size and header bytes (cheap, content-sensitive)."""
        h = hashlib.sha256()
        for fname in self.files():
            self._header(fname)
            h.update(f"{fname}:{(self.dir / fname).stat().st_size}:".encode())
            h.update(self._raw[fname])
        return h.hexdigest()

    def side_files(self) -> list[Path]:
        """Non-weight files at the root (tokenizer, generation config, chat template, ...) the path rule lets us read."""
        return self._side_scan()[0]

    def skipped_side_files(self) -> list[str]:
        """Side files the path rule refused, each as "name: reason" (reported, never copied)."""
        return self._side_scan()[1]

    def _side_scan(self) -> tuple[list[Path], list[str]]:
        skip = {INDEX, MANIFEST, "config.json"}
        found, refused = [], []
        for p in sorted(self.root.iterdir()):
            if p.suffix == ".safetensors" or p.name in skip or not (p.is_file() or p.is_symlink()):
                continue
            why = outside_reason(self.real, self.real / p.name)
            if why is None and p.is_file():
                found.append(p)
            else:
                refused.append(f"{p.name}: {why or 'a link to nothing'}")
        return found, refused


# ---------------------------------------------------------------- writing


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
                 command: str = "quantkit", sources: Mapping[str, dict[str, str]] | None = None) -> None:
        """``sources.get(file, {})``: the sha256 of each source file output ``file`` is made from (may wait
        for them); --resume keeps a file only if these are the same now (headers alone prove nothing: a
        fixed shard keeps its header)."""
        self.dst = destination.named(dst)  # a symlink DST is the link itself (quantkit/destination.py)
        self.tmp = destination.sibling(self.dst, "partial")
        self.force = force
        self.job = job or {}
        self.sources = sources or {}
        self.done: dict[str, str] = {}
        self.made_from: dict[str, dict[str, str]] = {}
        self.stale: list[str] = []  # files of the interrupted run redone because a source file they read changed
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
        for fname, digest in state.get("files", {}).items():
            if made_from.get(fname, {}) != self.sources.get(fname, {}):
                self.stale.append(fname)
            elif (self.tmp / fname).exists() and sha256_file(self.tmp / fname) == digest:
                self.done[fname] = digest
                self.made_from[fname] = made_from.get(fname, {})

    def _save_progress(self) -> None:
        tmp = self.tmp / (PROGRESS + ".tmp")
        tmp.write_text(json.dumps({"job": self.job, "files": self.done, "made_from": self.made_from}, indent=1))
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
