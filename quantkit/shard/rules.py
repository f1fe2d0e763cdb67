"""Split tables: for every tensor of a family, how EP/TP/DP serving splits it.  The rules are the family's data
(:attr:`quantkit.families.Family.shard`; their kinds, ``replicate`` / ``column`` / ``row`` / ``expert`` / ``fused``,
are described in :mod:`quantkit.families.splits`); this module matches a tensor to its rule.

Quantization scales follow their weight (see :mod:`quantkit.shard.geometry`).  Rules match the
HF root tensor name with its parameter suffix (``weight``, ``bias``, ``weight_scale_inv``,
``weight_scale``, GPT-OSS ``_blocks`` / ``_scales`` / ``_bias`` / ``_scale_inv`` / ``_scale``);
a tensor that no rule matches is an error, never silently replicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import families
from ..families.splits import KINDS, Rule
from .layout import ShardError

__all__ = ["KINDS", "Rule", "Table", "table", "match"]


@dataclass(frozen=True)
class Table:
    family: str
    rules: tuple[Rule, ...]


# parameter suffixes of a module (none: GPT-OSS sinks); the fused-expert pattern carries its own
PARAMS = r"(\.weight|\.bias|\.weight_scale_inv|\.weight_scale|\.e_score_correction_bias)?"
FUSED_PARAMS = r"(_blocks|_scales|_bias|_scale_inv|_scale)?"

LAYER_RE = re.compile(r"model\.layers\.(\d+)\.")
EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.")


def table(family: str) -> Table:
    """The family's split rules (its module declares them)."""
    if family not in families.FAMILIES:
        raise ShardError(f"no shard table for family {family!r}; known: {', '.join(families.FAMILIES)}")
    return Table(family, families.get(family).shard)


def match(t: Table, name: str) -> tuple[Rule, str]:
    """(rule, parameter suffix) for tensor ``name``; an error naming the tensor when none applies."""
    for r in t.rules:
        params = FUSED_PARAMS if r.kind == "fused" else PARAMS
        m = re.fullmatch(f"(?:{r.pattern})(?P<param>{params})", name)
        if m:
            return r, m.group("param").lstrip(".")
    raise ShardError(f"tensor {name!r}: no {t.family} shard rule covers it (unknown tensor for this family)")
