"""The one registry of family converters: family name -> function building its conversion items.

A converter module registers itself when imported (``quantkit.converters`` imports them all).
"""

from __future__ import annotations

from collections.abc import Callable

from ..checkpoint import Checkpoint, CheckpointError
from ..modelconfig import ModelConfig
from .items import Item

# (checkpoint, its config as read by quantkit.modelconfig, where-string for messages) -> items in output order
Builder = Callable[[Checkpoint, ModelConfig, str], list[Item]]
BUILDERS: dict[str, Builder] = {}


def register(family: str, builder: Builder) -> None:
    if family in BUILDERS:
        raise ValueError(f"converter for {family!r} registered twice")
    BUILDERS[family] = builder


def build_items(family: str, ckpt: Checkpoint, model: ModelConfig, where: str) -> list[Item]:
    if family not in BUILDERS:
        raise CheckpointError(f"{where}: no converter for family {family!r}; converters exist for {', '.join(sorted(BUILDERS))}")
    return BUILDERS[family](ckpt, model, where)
