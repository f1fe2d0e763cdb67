"""Fixtures of the engine tests: tiny transformers-made checkpoints, one per kind, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from .tiny import make_tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """kind -> path of its tiny checkpoint (made once per session)."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = make_tiny(kind, tmp_path_factory.mktemp(kind))
        return made[kind]

    return get
