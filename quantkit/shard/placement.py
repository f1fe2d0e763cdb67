"""Routed expert -> EP rank maps: contiguous, round-robin, or balanced from an expert-load histogram.

* ``contiguous``   rank r holds experts [r E/ep, (r+1) E/ep) (DeepSeek-V3 inference/convert.py).
* ``round-robin``  expert e on rank e mod ep.
* ``balanced``     per layer, experts by descending load (ties: lower id first) each go to the rank
                   with the least load so far among ranks holding fewer than E/ep (ties: lower
                   rank) — longest-processing-time first with equal expert counts per rank.

Every rank holds exactly E/ep experts of every MoE layer (EP must divide E).  A rank's experts
are kept in ascending global id ("local order").

Expert-load file (JSON): ``{"layers": {"<layer>": [count of expert 0, ..., count of expert E-1]}}``
(the ``"layers"`` wrapper is optional), one entry for every MoE layer; counts are non-negative
numbers such as tokens routed per expert.
"""

from __future__ import annotations

import json
from pathlib import Path

from .layout import ShardError

PLACEMENTS = ("contiguous", "round-robin", "balanced")
ExpertMap = dict[int, list[int]]  # layer -> rank of each global expert id


def read_load(path: str | Path, layers: list[int], n_experts: int) -> dict[int, list[float]]:
    """Parse and check an expert-load histogram for exactly these MoE ``layers``."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShardError(f"{p}: cannot read expert-load JSON ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("layers"), dict):
        data = data["layers"]
    if not isinstance(data, dict):
        raise ShardError(f"{p}: expected {{\"layers\": {{\"<layer>\": [counts per expert]}}}}")
    out: dict[int, list[float]] = {}
    for key, counts in data.items():
        if not str(key).isdigit() or int(key) not in layers:
            raise ShardError(f"{p}: layer {key!r} is not a MoE layer of this checkpoint (MoE layers: {_span(layers)})")
        ok = isinstance(counts, list) and all(isinstance(c, (int, float)) and not isinstance(c, bool) and c >= 0 for c in counts)
        if not ok or len(counts) != n_experts:
            raise ShardError(f"{p}: layer {key}: expected a list of {n_experts} non-negative counts (one per expert)")
        out[int(key)] = [float(c) for c in counts]
    missing = [layer for layer in layers if layer not in out]
    if missing:
        raise ShardError(f"{p}: no counts for MoE layer(s) {_span(missing)}: every MoE layer needs one")
    return out


def _span(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:8])) + (", ..." if len(xs) > 8 else "")


def place(kind: str, layers: list[int], n_experts: int, ep: int, load: dict[int, list[float]] | None) -> ExpertMap:
    if kind not in PLACEMENTS:
        raise ShardError(f"--placement must be one of {', '.join(PLACEMENTS)}, not {kind!r}")
    if layers and n_experts % ep:
        raise ShardError(f"{n_experts} routed experts do not divide over --ep {ep}: every EP rank must hold the same number")
    if kind == "balanced" and load is None:
        raise ShardError("--placement balanced needs --expert-load FILE (counts per layer per expert)")
    per = n_experts // ep if layers else 0
    if kind == "contiguous":
        return {layer: [e // per for e in range(n_experts)] for layer in layers}
    if kind == "round-robin":
        return {layer: [e % ep for e in range(n_experts)] for layer in layers}
    assert load is not None
    return {layer: _balance(load[layer], ep, per) for layer in layers}


def _balance(counts: list[float], ep: int, per: int) -> list[int]:
    owner = [0] * len(counts)
    total = [0.0] * ep
    held = [0] * ep
    for e in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        r = min((r for r in range(ep) if held[r] < per), key=lambda r: (total[r], r))
        owner[e] = r
        total[r] += counts[e]
        held[r] += 1
    return owner


def local_experts(emap: ExpertMap, rank: int) -> dict[int, list[int]]:
    """layer -> global expert ids on ``rank``, in local order (ascending)."""
    return {layer: [e for e, r in enumerate(owners) if r == rank] for layer, owners in emap.items()}


def load_stats(emap: ExpertMap, load: dict[int, list[float]], ep: int) -> dict:
    """Per-layer and overall max/mean load per rank (1.0 is perfect balance)."""
    per_layer: dict[str, float] = {}
    overall = [0.0] * ep
    for layer, owners in sorted(emap.items()):
        ranks = [0.0] * ep
        for e, r in enumerate(owners):
            ranks[r] += load[layer][e]
        overall = [a + b for a, b in zip(overall, ranks)]
        per_layer[str(layer)] = _ratio(ranks)
    ratios = list(per_layer.values())
    return {
        "max_over_mean_worst_layer": max(ratios) if ratios else 1.0,
        "max_over_mean_avg_layer": sum(ratios) / len(ratios) if ratios else 1.0,
        "max_over_mean_all_layers": _ratio(overall),
        "per_layer": per_layer,
        "per_rank_total": overall,
    }


def _ratio(ranks: list[float]) -> float:
    mean = sum(ranks) / len(ranks)
    return max(ranks) / mean if mean > 0 else 1.0
