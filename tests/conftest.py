"""Shared test configuration.

Hypothesis runs a small, fast profile by default so the CPU suite stays quick on 2 cores;
``pytest --hypothesis-profile thorough`` explores much more (the hypothesis pytest plugin reads
that option after this file has loaded the default).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Without CUDA, Triton kernels run in Triton's CPU interpreter (tests/kernels).  Triton decides
# interpreted vs compiled when quantkit.kernels is imported, which engine modules already do at
# collection time, so the variable must be set before any test module is imported: here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "fast",
    max_examples=25,
    deadline=None,  # the first call of a torch op can be slow; timing is not what these tests check
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile("fast")


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator, so random test inputs are the same on every run."""
    return torch.Generator().manual_seed(1234)
