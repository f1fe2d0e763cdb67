"""Synthetic tiny checkpoints for the serving tests, made once and removed when these tests end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="package")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    """ckpt(family) -> path of its ``quantkit synth`` tiny checkpoint (seed 0, with its tokenizer)."""
    from quantkit.synth import synthesize

    root, made = tmp_path_factory.mktemp("serve"), {}

    def get(family: str) -> Path:
        if family not in made:
            synthesize(family, root / family, preset="tiny")
            made[family] = root / family
        return made[family]

    yield get
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="package")
def model(ckpt):
    """model(family) -> the engine model, float32, activations unquantized (so a cached step equals a
    cache-less recomputation to float rounding, and greedy tokens agree)."""
    from quantkit.engine import load

    made = {}

    def get(family: str):
        if family not in made:
            made[family] = load(ckpt(family), dtype=torch.float32, act_quant=False)
        return made[family]

    return get


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
