"""The serving engine on CUDA with the fast kernels (bf16 activations, fp8-block weights, Triton /
FlashInfer ops): every decode step's distribution against a cache-less prefill of the same
sequence on the same device, the prefill kernels being checked against the torch references in
tests/kernels and tests/engine."""

from __future__ import annotations

import pytest
import torch

from quantkit.engine import load, prefill_logits
from quantkit.serve.sampling import SamplingParams
from quantkit.serve.scheduler import LLMEngine

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["gpt-oss", "deepseek-v3", "qwen3-moe"])
def test_cuda_engine_steps_match_prefill(ckpt, tmp_path, family):
    from quantkit.converters import ConvertOptions, convert

    dst = tmp_path / "fp8"
    convert(ckpt(family), dst, ConvertOptions(to="fp8-block"))
    m = load(dst, "cuda", torch.bfloat16)
    eng = LLMEngine(m, num_blocks=64, block_size=16, max_num_batched_tokens=24)  # 40-token prompts go in two chunks
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1900, (n,), generator=g).tolist() for n in (40, 7, 1, 40)]
    reqs = [eng.add_request(p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=1)) for p in prompts]
    eng.run_all()
    worst = 0.0
    for p, r in zip(prompts, reqs):
        ref = torch.log_softmax(prefill_logits(m, [p + r.output])[0].float().cpu(), -1)
        for i, e in enumerate(r.logprobs):
            row = ref[len(p) - 1 + i]
            worst = max(worst, abs(e.logprob - row[e.token].item()))
            assert row[e.token] >= row.max() - 0.1, (i, e.token, row.argmax().item())  # greedy's pick is (near) the top
    assert worst < 0.1, worst
    assert len(eng.cache.free_blocks) == 64
