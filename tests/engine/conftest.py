"""Fixtures of the engine tests: tiny transformers-made checkpoints, one per kind, made once and removed when the engine tests end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .tiny import make_tiny


@pytest.fixture(scope="package")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """kind -> path of its tiny checkpoint (made once; removed when the engine tests end)."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = make_tiny(kind, tmp_path_factory.mktemp(kind))
        return made[kind]

    yield get
    for path in made.values():
        shutil.rmtree(path, ignore_errors=True)
