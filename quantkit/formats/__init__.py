"""Numeric formats: the pure-torch reference implementations every kernel and converter is tested against.

Each format module registers a :class:`Format` here when it is imported; ``convert --to`` and
``inspect`` name formats by these keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import e8m0, exact, fp8, fp8_block, mxfp4, mxfp8, rounding  # noqa: F401
from .rounding import NEAREST, Rounding

__all__ = ["FORMATS", "Format", "Rounding", "NEAREST", "register", "get"]


@dataclass(frozen=True)
class Format:
    """A checkpoint weight format as ``convert --to`` and ``inspect`` name it."""

    name: str
    description: str
    scale_suffix: str | None  # tensor-name suffix of the scale beside ``weight`` (None: unscaled)
    is_target: bool  # can ``convert --to`` produce it


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} registered twice")
    FORMATS[fmt.name] = fmt
    return fmt


def get(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; known: {', '.join(FORMATS)}") from None


register(Format("bf16", "plain BF16 weights", None, True))
register(Format("fp8-block", "E4M3 with one F32 scale per 128x128 tile (HF/DeepSeek fine-grained FP8)", "weight_scale_inv", True))
register(Format("fp8-block-ue8m0", "fp8-block with power-of-two (UE8M0) scales, DeepSeek-V3.1 style", "weight_scale_inv", False))
register(Format("mxfp8", "E4M3 with one E8M0 scale per 1x32 along K (compressed-tensors mxfp8)", "weight_scale", True))
register(Format("mxfp4", "E2M1 with one E8M0 scale per 1x32 along K (GPT-OSS blocks/scales)", "_scales", False))
