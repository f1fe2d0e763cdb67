from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import torch

from .support import Synth


@pytest.fixture(scope="package")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    """``synth(family, preset="tiny", layout="root", scale_fmt="float")`` -> a checkpoint made once, removed when the converter tests end."""
    made = Synth(tmp_path_factory.mktemp("synth"))
    yield made
    shutil.rmtree(made.root, ignore_errors=True)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, and on a shared 2-core runner they lose a lot."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
