"""The engine on a CUDA device computes what it computes on the CPU (the same layers; the dispatcher
may pick GPU backends for the quantized ops, which are tested bit-exact against the references)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quantkit.engine import load, prefill_logits

from .tiny import requantize, token_ids

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(("kind", "fmt"), [("deepseek-v3", "fp8-block"), ("qwen3-moe", "mxfp8"), ("gpt-oss", "mxfp4")])
def test_cuda_equals_cpu(tiny, tmp_path: Path, kind: str, fmt: str) -> None:
    q, _ = requantize(tiny(kind), tmp_path / fmt, fmt, mxfp4_experts_only=fmt == "mxfp4")
    seqs = [token_ids(11, seed=1), token_ids(5, seed=2)]
    cpu = prefill_logits(load(q, "cpu", torch.float32), seqs)
    gpu_model = load(q, "cuda", torch.float32)
    gpu = prefill_logits(gpu_model, seqs)
    for c, g in zip(cpu, gpu, strict=True):
        assert g.device.type == "cuda"
        assert (c - g.cpu()).abs().max().item() < 1e-3 * max(1.0, c.abs().max().item())
    assert gpu_model.ops.ran  # says which backend ran each quantized op
