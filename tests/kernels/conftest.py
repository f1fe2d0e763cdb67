"""Kernel tests run the Triton kernels on CUDA when there is a device, else in Triton's CPU
interpreter.  Triton decides interpreted vs compiled when a kernel is decorated, i.e. when
quantkit.kernels is imported, so TRITON_INTERPRET=1 must be set before that: tests/conftest.py
does it for the whole CPU run (engine modules import the kernels at collection time); this file
repeats it for runs that start here.  Triton reads the variable; quantkit does not.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def triton_device() -> torch.device:
    """Where the explicit ``backend="triton"`` tests run: CUDA, or the CPU interpreter."""
    from quantkit.kernels import triton_numerics

    if HAS_CUDA:
        return torch.device("cuda")
    if not triton_numerics.interpreted():
        pytest.fail(
            "no CUDA device and the Triton kernels are compiled: quantkit.kernels was imported before "
            "TRITON_INTERPRET=1 was set (tests/conftest.py sets it), or it is set to 0"
        )
    return torch.device("cpu")
