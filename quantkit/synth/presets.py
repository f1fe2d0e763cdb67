"""Shapes of the synthetic checkpoints, per family and preset: each family's ``presets`` (data, in its
:mod:`quantkit.families` module).

``tiny``: a few MB; every weight dimension a multiple of 128, so transformers' CPU dequantizers
accept it.  ``tiny-ragged``: the real models' ragged shapes in miniature (DeepSeek's 576-row
kv_a_proj_with_mqa, GPT-OSS's 2880 = 22.5 x 128), so partial 128-tiles are exercised; judged by
DeepSeek's dequant rule, not transformers.  The full-size presets carry the released models' shapes
(REFERENCE.md; upstream config.json files) and real vocabulary sizes; ``--layers`` cuts their depth.

``tok_base``: ids [0, tok_base) are BPE tokens; the family's special tokens follow (ids as in the
real tokenizer for full-size presets).  ``tok_reserved``: how many reserved / placeholder
specials the tokenizer carries.
"""

from __future__ import annotations

from .. import families


def dims(family: str, preset: str, layers: int | None) -> dict:
    """The preset's dimensions (a copy), with ``layers`` overriding the depth; a clear error otherwise."""
    known = [f.name for f in families.FAMILIES.values() if f.presets]
    if family not in known:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(known)}")
    table = families.get(family).presets
    if preset not in table:
        raise ValueError(f"family {family} has no preset {preset!r}; known: {', '.join(table)}")
    d = dict(table[preset])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be at least 1, got {layers}")
        d["layers"] = layers
    return d
