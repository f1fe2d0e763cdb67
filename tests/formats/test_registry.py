"""The format registry that ``convert --to`` and ``inspect`` name formats by."""

from __future__ import annotations

import pytest

from quantkit import formats


def test_registered_formats() -> None:
    assert set(formats.FORMATS) == {"bf16", "fp8-block", "fp8-block-ue8m0", "mxfp8", "mxfp4"}
    targets = {name for name, f in formats.FORMATS.items() if f.is_target}
    assert targets == {"bf16", "fp8-block", "mxfp8"}  # DESIGN.md's target table
    assert formats.get("mxfp8").scale_suffix == "weight_scale"
    assert formats.get("fp8-block").scale_suffix == "weight_scale_inv"
    assert formats.get("bf16").scale_suffix is None


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown format 'nvfp4'; known: bf16, fp8-block"):
        formats.get("nvfp4")


def test_registering_a_name_twice_is_refused() -> None:
    before = dict(formats.FORMATS)
    with pytest.raises(ValueError, match="registered twice"):
        formats.register(formats.Format("mxfp8", "dup", None, False))
    assert formats.FORMATS == before
