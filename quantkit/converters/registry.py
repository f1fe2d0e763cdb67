"""The one registry of family converters: family name -> function building its conversion items.

A converter module registers itself when imported (``quantkit.converters`` imports them all).
"""

from __future__ import annotations

from collections.abc import Callable

from ..checkpoint import Checkpoint, CheckpointError
from .items import Item

# (checkpoint, config.json as a dict, where-string for messages) -> items in output order
Builder = Callable[[Checkpoint, dict, str], list[Item]]
BUILDERS: dict[str, Builder] = {}


def register(family: str, builder: Builder) -> None:
    if family in BUILDERS:
        raise ValueError(f"converter for {family!r} registered twice")
    BUILDERS[family] = builder


def build_items(family: str, ckpt: Checkpoint, config: dict, where: str) -> list[Item]:
    if family not in BUILDERS:
        raise CheckpointError(f"{where}: no converter for family {family!r}; converters exist for {', '.join(sorted(BUILDERS))}")
    try:
        return BUILDERS[family](ckpt, config, where)
    except KeyError as e:
        raise CheckpointError(f"{where}: config.json has no {e.args[0]!r}, which a {family} checkpoint needs") from None
