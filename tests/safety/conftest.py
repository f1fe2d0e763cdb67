"""Tiny synthesized sources, one per family, made once for the safety tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from quantkit.synth import synthesize


@pytest.fixture(scope="package")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """family -> a tiny synth of it (made once), with a README.md side file."""
    root = tmp_path_factory.mktemp("safety")

    def get(family: str) -> Path:
        src = root / family
        if not src.exists():
            synthesize(family, src, preset="tiny", max_shard_size="300KB")
            (src / "README.md").write_text("the model card\n")
        return src

    return get


@pytest.fixture
def base(bases) -> Path:
    return bases("qwen3-moe")
