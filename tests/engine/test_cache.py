"""Serving-shaped forward: KV-cache decode equals full prefill, batched sequences equal separate
ones, and a step may mix a prefill chunk of one sequence with decode tokens of others.  Compared
against the engine's own cache-less prefill, which test_faithfulness ties to transformers."""

from __future__ import annotations

import pytest
import torch
from .tiny import token_ids

from quantkit.engine import Batch, KVCache, load, prefill_logits
from quantkit.engine.run import greedy

KINDS = ["gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe"]
TOL = 2e-5


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("kind", KINDS)
def test_decode_with_cache_equals_prefill(tiny, kind: str) -> None:
    """Two sequences: prefill a prefix in one step, then chunks and single tokens, block size 4
    (sequences span several blocks; 11 tokens cross the sliding window of 4)."""
    model = load(tiny(kind), dtype=torch.float32)
    a, b = token_ids(11, seed=3), token_ids(9, seed=4)
    full_a, full_b = prefill_logits(model, [a, b])
    cache = model.new_cache(num_blocks=8, block_size=4)
    got: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    pos = {"a": 0, "b": 0}
    seqs = {"a": a, "b": b}
    # step plans: tokens per sequence (a prefill chunk, decode steps, a mixed step)
    for plan in ({"a": 5, "b": 3}, {"a": 1, "b": 1}, {"b": 4, "a": 1}, {"a": 1}, {"a": 3, "b": 1}):
        step = cache.schedule(plan)
        ids = torch.cat([seqs[s][pos[s] : pos[s] + n] for s, n in plan.items()])
        logits = model(ids, step.positions, cache, step)
        for (s, n), (lo, hi) in zip(plan.items(), step.segments(), strict=True):
            got[s].append(logits[lo:hi])
            pos[s] += n
    assert pos == {"a": 11, "b": 9}
    assert _max_diff(torch.cat(got["a"]), full_a) < TOL
    assert _max_diff(torch.cat(got["b"]), full_b) < TOL


@pytest.mark.parametrize("kind", KINDS)
def test_batched_sequences_equal_separate_ones(tiny, kind: str) -> None:
    model = load(tiny(kind), dtype=torch.float32)
    seqs = [token_ids(n, seed=10 + n) for n in (6, 1, 9)]
    together = prefill_logits(model, seqs)
    for s, t in zip(seqs, together, strict=True):
        assert _max_diff(prefill_logits(model, [s])[0], t) < TOL


def test_greedy_decode_matches_argmax_of_prefill(tiny) -> None:
    model = load(tiny("gpt-oss"), dtype=torch.float32)
    prompts = [token_ids(5, seed=7), token_ids(3, seed=8)]
    outs = greedy(model, prompts, max_new_tokens=6, block_size=4)
    for p, new in zip(prompts, outs, strict=True):
        seq = torch.cat([p, torch.tensor(new)])
        logits = prefill_logits(model, [seq])[0]
        assert new == logits[len(p) - 1 : -1].argmax(-1).tolist()


def test_cache_bookkeeping_and_errors(tiny) -> None:
    model = load(tiny("qwen3"), dtype=torch.float32)
    cache: KVCache = model.new_cache(num_blocks=3, block_size=4)
    step = cache.schedule({"x": 6})
    assert step.positions.tolist() == list(range(6)) and step.context_lens == (6,)
    assert sorted(step.slot_mapping.tolist()) == sorted(set(step.slot_mapping.tolist()))
    with pytest.raises(RuntimeError, match="out of blocks"):
        cache.schedule({"y": 5})
    cache.release("x")
    assert len(cache.free_blocks) == 3
    with pytest.raises(ValueError, match="at least one new token"):
        cache.schedule({"x": 0})
    ids = token_ids(4)
    with pytest.raises(ValueError, match="pass the Batch"):
        model(ids, None, cache)
    with pytest.raises(ValueError, match="must both be"):
        model(ids, batch=Batch.prefill([3]))
