"""HF checkpoint directories: validated lazy reads through safe_open (writing: :mod:`.writer`).

Reading: a directory with ``model.safetensors`` or a ``model.safetensors.index.json`` (the index
is trusted for the name -> file map, never the shard names), or GPT-OSS's ``original/`` folder.
Every safetensors header is validated before use (length, JSON, dtypes, offsets that tile the
data region and match the file size), so a truncated or lying file fails with its name.
Only files inside the checkpoint are read (:mod:`.paths`).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from .paths import RULE, outside_reason

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
