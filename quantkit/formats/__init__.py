"""Numeric formats: the pure-torch reference implementations every kernel and converter is tested against.

Each format module defines a :class:`Format` subclass, which registers itself in :data:`FORMATS` when the
module is imported (:mod:`.registry` says what a format carries); ``convert --to``, ``inspect``, the engine and
the kernels name formats by these keys and ask the registered object.
"""

from __future__ import annotations

# the format modules register in this order (plain bf16 first, from .registry): the order choices are listed in
from . import fp8_block, mxfp8, mxfp4  # noqa: I001
from . import e8m0, exact, fp8, rounding  # noqa: F401
from .registry import FORMATS, Format, Grid, act_formats, convert_targets, get, reference, register
from .rounding import NEAREST, Rounding

__all__ = ["FORMATS", "Format", "Grid", "Rounding", "NEAREST", "act_formats", "convert_targets", "get", "reference", "register"]
