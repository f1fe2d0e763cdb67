"""The consumer refusals ``inspect`` warns about (quantkit/consumers.py) are real: transformers refuses
these checkpoints, and inspect names the refusal.  When a transformers release lifts one, this fails
and the warning goes."""

from __future__ import annotations

import logging

import pytest
import torch

from quantkit.inspect import inspect

from . import ct
from .support import run


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)


def refusal(path) -> str:
    """transformers' load report for ``path`` (it logs the reason, then raises); fails if it loads."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with pytest.raises(Exception, match="automatic conversion of the weights"):
            load(path)
    finally:
        logger.removeHandler(handler)
    return "\n".join(records)


def test_transformers_refuses_partial_fp8_tiles(synth, tmp_path) -> None:
    run(synth("qwen3-moe", preset="tiny-ragged"), tmp_path / "o", to="fp8-block")
    (warning,) = inspect(str(tmp_path / "o")).warnings
    assert "transformers 5.24 will refuse" in warning and "not divisible by scale grid" in warning
    assert "not divisible by scale grid" in refusal(tmp_path / "o")


@pytest.mark.parametrize("made_by", ["quantkit", "compressed-tensors"])
def test_transformers_refuses_compressed_tensors_moe_experts(synth, tmp_path, made_by) -> None:
    if made_by == "quantkit":
        run(synth("qwen3-moe"), tmp_path / "o", to="mxfp8")
    else:
        pytest.importorskip("compressed_tensors")
        ct.make(synth("qwen3-moe"), tmp_path / "o", "MXFP8")
    (warning,) = inspect(str(tmp_path / "o")).warnings
    assert "compressed-tensors MoE checkpoint" in warning
    assert "must match the size of tensor b" in refusal(tmp_path / "o")
    run(tmp_path / "o", tmp_path / "bf16", to="bf16")  # what quantkit makes of it, transformers loads
    assert load(tmp_path / "bf16") is not None and inspect(str(tmp_path / "bf16")).warnings == []
