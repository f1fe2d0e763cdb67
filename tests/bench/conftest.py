"""Benchmark tests run with one torch thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine OpenMP's spinning threads made a tiny serve run 7x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
