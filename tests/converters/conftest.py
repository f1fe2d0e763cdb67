from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from .support import Synth


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """``synth(family, preset="tiny", layout="root", scale_fmt="float")`` -> a checkpoint made once per session."""
    return Synth(tmp_path_factory.mktemp("synth"))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, and on a shared 2-core runner they lose a lot."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
