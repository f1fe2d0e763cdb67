"""quantkit.bench.serve's HBM floor: the bytes a decode step must read (its smoke run is in test_smoke.py)."""

from __future__ import annotations

import torch

from quantkit.bench import serve as bench_serve


def test_step_bytes_counts_the_experts_a_batch_can_touch(tmp_path):
    from quantkit.engine import load
    from quantkit.engine.layers.moe import MoE
    from quantkit.synth import synthesize

    synthesize("qwen3-moe", tmp_path / "m", preset="tiny")
    m = load(tmp_path / "m", dtype=torch.bfloat16)
    moes = [x for x in m.modules() if isinstance(x, MoE)]
    e, k = moes[0].experts.num_experts, moes[0].router.routing.top_k
    expert_bytes = sum(t.numel() * t.element_size() for x in moes for t in list(x.experts.buffers()))
    kv_token = sum(int(torch.Size(s).numel()) for spec in m.cache_specs() for s in spec.values()) * 2
    # one sequence touches k of E experts; a huge batch touches them all
    one, many = bench_serve.step_bytes(m, 1, 0), bench_serve.step_bytes(m, 10_000, 0)
    row = m.embed_tokens.shape[1] * 2
    assert abs(many - one - (expert_bytes * (1 - k / e) + (10_000 - 1) * row)) <= 2 * len(moes)  # int() per layer
    assert bench_serve.step_bytes(m, 1, 100) - one == 100 * kv_token
