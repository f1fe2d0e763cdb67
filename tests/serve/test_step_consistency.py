"""With activation quantization on (the served numerics), the engine's cached steps compute the same
function as a cache-less prefill: float32 on the CPU, the torch reference ops.

FP8 activation quantization rounds to 3 mantissa bits, so a float32 summation-order difference that
lands on a rounding boundary moves one element by an E4M3 step; that happens on a few positions, not
on most.  The bound: the median error over every sampled step stays at float32 rounding (1e-4), and
no step moves more than 0.2 nats.  DeepSeek-V3's MLA breaks the median when its prefill path
quantizes the cached latents and its absorbed decode path does not (errors of 0.2-2.6 nats on most
decode steps): both paths must multiply the same unquantized latents by the same dequantized
kv_b_proj weight.
"""

from __future__ import annotations

import pytest
import torch

from quantkit.engine import load, prefill_logits
from quantkit.serve.sampling import SamplingParams
from quantkit.serve.scheduler import LLMEngine


@pytest.mark.parametrize("family", ["deepseek-v3", "gpt-oss", "qwen3-moe"])
def test_quantized_activation_steps_match_prefill(ckpt, family):
    m = load(ckpt(family), "cpu", torch.float32, act_quant=True)
    eng = LLMEngine(m, num_blocks=64, block_size=16, max_num_batched_tokens=24)  # 40-token prompts in two chunks
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1900, (n,), generator=g).tolist() for n in (40, 7, 1, 40)]
    reqs = [eng.add_request(p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)) for p in prompts]
    eng.run_all()
    errs = []
    for p, r in zip(prompts, reqs):
        ref = torch.log_softmax(prefill_logits(m, [p + r.output])[0], -1)
        errs += [abs(e.logprob - ref[len(p) - 1 + i, e.token].item()) for i, e in enumerate(r.logprobs)]
    errs_t = torch.tensor(errs)
    assert errs_t.median() < 1e-4, (family, errs_t.median().item(), errs)
    assert errs_t.max() < 0.2, (family, errs_t.max().item(), errs)
