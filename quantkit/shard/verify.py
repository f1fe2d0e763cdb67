"""Check a sharded output against its source, from what is on disk only (not from the planner).

1. Files: every rank file is listed in quantkit.json with its sha256 (hashed once per inode) and
   nothing else is there.
2. Holdings: each rank's coordinates follow rank = dp_rank x TP + tp_rank; a routed expert's
   tensors are on exactly the rank that quantkit.json's expert map gives, a fused expert tensor
   on every rank with exactly that rank's experts; every other tensor is on every rank
   (whole or its TP slice); no rank holds a tensor the source lacks.
3. Bytes: reassembling the pieces (by the rank configs' ``quantkit_shard.splits``) reproduces
   every source tensor byte for byte; the pieces tile it, and overlapping pieces (replicated KV
   heads) are identical.
4. Scales: every local block scale fits its local weight (scale grid of the slice, tile-aligned start).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from ..checkpoint import MANIFEST, Checkpoint
from ..writer import sha256_file
from . import geometry as geo
from .layout import ShardError

_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Same-shape view with one trailing byte dim, so any dtype compares and copies bit for bit."""
    return t.contiguous().unsqueeze(-1).view(torch.uint8)


def verify(dst: str | Path, src: Checkpoint) -> dict:
    dst = Path(dst)
    man = json.loads((dst / MANIFEST).read_text())
    if man["source"]["fingerprint"] != src.fingerprint():
        raise ShardError(f"{dst / MANIFEST}: made from another source (fingerprint differs from {src.root})")
    hashed = _check_files(dst, man)
    ranks = [Checkpoint(dst / r["dir"]) for r in man["ranks"]]
    metas = [_meta(ck, r, man["parallel"]) for ck, r in zip(ranks, man["ranks"])]
    holders = _check_holdings(src, ranks, metas, man["experts"]["map"])
    n_bytes = sum(_reassemble(src, name, holders[name]) for name in src.names())
    for ck, meta in zip(ranks, metas):
        _check_scales(ck, meta["splits"])
    return {"ok": True, "tensors": len(src.names()), "ranks": len(ranks), "files_hashed": hashed, "bytes_compared": n_bytes}


def _check_files(dst: Path, man: dict) -> int:
    want = man["files"]
    have = {str(p.relative_to(dst)) for r in man["ranks"] for p in (dst / r["dir"]).iterdir()}
    if have != set(want):
        extra, missing = sorted(have - set(want)), sorted(set(want) - have)
        raise ShardError(f"{dst}: files on disk and in {MANIFEST} differ (extra {extra[:3]}, missing {missing[:3]})")
    seen: dict[tuple[int, int], str] = {}
    for rel, digest in want.items():
        st = os.stat(dst / rel)
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen[key] = sha256_file(dst / rel)
        if seen[key] != digest:
            raise ShardError(f"{dst / rel}: sha256 differs from {MANIFEST}: the file changed or is corrupt")
    return len(seen)


def _meta(ck: Checkpoint, r: dict, par: dict) -> dict:
    meta = ck.config.get("quantkit_shard")
    if not isinstance(meta, dict):
        raise ShardError(f"{ck.root / 'config.json'}: no quantkit_shard section")
    coords = (meta["rank"], meta["dp_rank"], meta["tp_rank"], meta["ep_rank"])
    if coords != (r["rank"], r["rank"] // par["tp"], r["rank"] % par["tp"], r["rank"]):
        raise ShardError(f"{ck.root}: coordinates {coords} break rank = dp_rank x tp + tp_rank")
    return meta


def _check_holdings(src: Checkpoint, ranks: list[Checkpoint], metas: list[dict], emap: dict) -> dict[str, list]:
    holders: dict[str, list] = {}
    for r, (ck, meta) in enumerate(zip(ranks, metas)):
        for name in ck.names():
            if name not in src:
                raise ShardError(f"{ck.root}: holds {name!r}, which the source does not have")
            holders.setdefault(name, []).append((r, ck, meta["splits"].get(name)))
    for name in src.names():
        got = sorted(r for r, _, _ in holders.get(name, []))
        m = _EXPERT.match(name)
        want = [emap[m.group(1)][int(m.group(2))]] if m else list(range(len(ranks)))
        if got != want:
            raise ShardError(f"{name}: held by ranks {got}, needed by exactly {want}")
        for r, ck, d in holders[name]:
            if d is not None and "experts" in d:
                layer = _LAYER.match(name)
                mine = [e for e, o in enumerate(emap[layer.group(1)]) if o == r] if layer else None
                if d["experts"] != mine:
                    raise ShardError(f"{ck.root}: {name} holds experts {d['experts']}, the map gives this rank {mine}")
    return holders


def _reassemble(src: Checkpoint, name: str, holders: list) -> int:
    ref = as_bytes(src.get(name))
    buf = torch.empty_like(ref)  # every slot is checked covered before the comparison
    covered: dict[int, torch.Tensor] = {}
    seen: set[tuple[int, int, str]] = set()
    for _, ck, d in holders:
        st = os.stat(ck.dir / ck.info(name).file)
        if (st.st_dev, st.st_ino, name) in seen:
            continue  # a hard link of a file already compared
        seen.add((st.st_dev, st.st_ino, name))
        piece = as_bytes(ck.get(name))
        if d is None:
            if not torch.equal(piece, ref):
                raise ShardError(f"{ck.root}: {name} differs from the source")
            continue
        if list(d["global_shape"]) != list(src.info(name).shape):
            raise ShardError(f"{ck.root}: {name} global_shape {d['global_shape']} is not the source's {list(src.info(name).shape)}")
        dim = d["dim"]
        idx = torch.tensor(d["experts"] if "experts" in d else range(d["start"], d["stop"]), dtype=torch.long)
        cov = covered.setdefault(dim, torch.zeros(ref.shape[dim], dtype=torch.bool))
        again = cov[idx]
        if again.any() and not torch.equal(buf.index_select(dim, idx[again]), piece.index_select(dim, again.nonzero().flatten())):
            raise ShardError(f"{ck.root}: {name} overlaps another rank's piece with different bytes")
        buf.index_copy_(dim, idx, piece)
        cov[idx] = True
    for dim, cov in covered.items():
        if not cov.all():
            raise ShardError(f"{name}: pieces leave {int((~cov).sum())} of {cov.numel()} slots along dim {dim} uncovered")
        if not torch.equal(buf, ref):
            raise ShardError(f"{name}: reassembled pieces differ from the source (first differing byte at flat index {int((buf != ref).flatten().nonzero()[0])})")
    return ref.numel()


def _check_scales(ck: Checkpoint, splits: dict) -> None:
    for name in ck.names():
        param = next((p for p in geo.SCALE_PARAMS if name.endswith("." + p)), None)
        if param is None or ck.info(name).numel == 1:
            continue
        wname = name[: -len(param)] + "weight"
        blocks = geo.scale_blocks(ck.info(name).dtype, name)
        geo.check_scale_shape(name, ck.info(name).shape, ck.info(wname).shape, blocks)
        s, w = splits.get(name), splits.get(wname)
        if (s is None) != (w is None) or (s and (s["dim"] != w["dim"] or s["start"] * blocks[s["dim"]] != w["start"])):
            raise ShardError(f"{ck.root}: {name} slice {s} does not follow its weight's slice {w}")
