"""Synthetic checkpoints shared by the synth tests: each is written once and removed when the synth tests end."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from quantkit.synth import synthesize


@pytest.fixture(scope="package")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """synth_dir(family, preset="tiny", **options) -> path of a checkpoint synthesized with seed 0."""
    cache: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("synth")

    def get(family: str, preset: str = "tiny", **options: object) -> Path:
        key = (family, preset, *sorted(options.items()))
        if key not in cache:
            dst = root / f"{family}-{preset}-{len(cache)}"
            synthesize(family, dst, preset=preset, **options)
            cache[key] = dst
        return cache[key]

    yield get
    shutil.rmtree(root, ignore_errors=True)
