"""--device cuda (quantkit.kernels' dispatcher: Triton where registered) writes the bytes the CPU
reference writes, stochastic rounding included."""

from __future__ import annotations

import pytest
import torch

from .support import run, shard_bytes

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.parametrize("family, preset", [("gpt-oss", "tiny-ragged"), ("deepseek-v3", "tiny-ragged"), ("qwen3-moe", "tiny")])
@pytest.mark.parametrize("to", ["fp8-block", "mxfp8", "bf16"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_cuda_bytes_equal_cpu_bytes(synth, tmp_path, family, preset, to, rounding) -> None:
    src = synth(family, preset)
    seed = 5 if rounding == "stochastic" else None
    run(src, tmp_path / "cpu", to=to, rounding=rounding, seed=seed)
    rep = run(src, tmp_path / "cuda", to=to, rounding=rounding, seed=seed, device="cuda", chunk_elements=1 << 16)
    assert shard_bytes(tmp_path / "cuda") == shard_bytes(tmp_path / "cpu")
    assert rep["run"]["device"] == "cuda"
