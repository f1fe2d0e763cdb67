"""Opening a source: its HF config (mapped from GPT-OSS's ``original/`` config when that is all there is),
its family, and zero-copy views of its tensors.

Views are ``torch.frombuffer`` over a private (copy-on-write, never written) mmap of each shard, so
the bytes read stay file pages — the page cache — and never count as the reader's anonymous memory.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint import DTYPES, Checkpoint, load_json_object, read_header
from ..families import FAMILIES, Family
from ..modelconfig import ModelConfig
from ..modelshapes import verify
from . import gpt_oss


@dataclass(frozen=True)
class TensorLoc:
    path: str  # absolute file path
    offset: int  # absolute byte offset of the data
    dtype: str  # safetensors tag
    shape: tuple[int, ...]


@dataclass
class OpenSource:
    ckpt: Checkpoint
    config: dict  # HF config.json
    model: ModelConfig  # what the config says, checked against the tensors
    family: Family
    where: str


def hf_config(ckpt: Checkpoint) -> dict:
    """The HF config: config.json at the root, else GPT-OSS's original/ config mapped to HF keys."""
    cfg = ckpt.config
    if cfg.get("architectures"):
        return cfg
    own = ckpt.dir / "config.json"
    orig = cfg
    if not cfg and own.exists():
        orig = load_json_object(ckpt.inside(own, "config").read_bytes(), str(own), "the file")
    if "experts_per_token" in orig and "num_experts" in orig:
        return gpt_oss.hf_config(orig, str(own))
    return cfg


def open_source(path: str | Path) -> OpenSource:
    ckpt = Checkpoint(path)
    cfg = hf_config(ckpt)
    mc = verify(ckpt, cfg)  # as every command reads and checks it; items.Expect then checks dtypes and formats
    return OpenSource(ckpt, cfg, mc, FAMILIES[mc.family], str(ckpt.dir))


def locations(ckpt: Checkpoint, names: set[str]) -> dict[str, TensorLoc]:
    """Absolute data offsets of ``names`` from the (already validated) shard headers."""
    locs: dict[str, TensorLoc] = {}
    for fname in ckpt.files():
        path = ckpt.dir / fname
        header, raw = read_header(path)
        base = 8 + len(raw)
        for name, e in header.items():
            if name in names:
                locs[name] = TensorLoc(str(path.resolve()), base + e["data_offsets"][0], e["dtype"], tuple(e["shape"]))
    return locs


class Reader:
    """Zero-copy tensor views over mmapped source shards (one map per file, opened lazily)."""

    def __init__(self, locs: dict[str, TensorLoc]) -> None:
        self.locs = locs
        self.maps: dict[str, mmap.mmap] = {}

    def _map(self, path: str) -> mmap.mmap:
        if path not in self.maps:
            with open(path, "rb") as f:
                self.maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return self.maps[path]

    def view(self, name: str) -> torch.Tensor:
        loc = self.locs[name]
        dtype = DTYPES[loc.dtype]
        n = 1
        for s in loc.shape:
            n *= s
        if n == 0:
            return torch.empty(loc.shape, dtype=dtype)
        raw = torch.frombuffer(self._map(loc.path), dtype=torch.uint8, count=n * dtype.itemsize, offset=loc.offset)
        if loc.offset % dtype.itemsize:  # safetensors does not promise alignment: copy this one tensor
            raw = raw.clone()
        return raw.view(dtype).reshape(loc.shape)

    def close(self) -> None:
        self.maps.clear()  # tensors still viewing a map keep it alive; it unmaps when they go
