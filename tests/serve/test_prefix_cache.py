"""Prefix caching: full KV blocks indexed by their tokens (chained with all before them) are reused by
later prompts that start the same way.  The judge stays the cache-less forward: every output equals
its greedy recomputation, with or without hits; the counters say how much was reused."""

from __future__ import annotations

from quantkit.serve.sampling import SamplingParams
from quantkit.serve.scheduler import LLMEngine

from .test_scheduler import recompute

BS = 4
SYSTEM = [101, 102, 103, 104, 105, 106, 107, 108, 109, 110]  # 10 tokens: two full blocks of 4 and 2 over
GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


def engine(m, blocks=64, caching=True, budget=2048) -> LLMEngine:
    return LLMEngine(m, num_blocks=blocks, block_size=BS, max_num_batched_tokens=budget, prefix_caching=caching)


def test_a_shared_prefix_is_computed_once(model):
    m = model("qwen3")
    eng = engine(m)
    a = eng.add_request(SYSTEM + [7, 8], GREEDY)
    eng.run_all()
    assert eng.stats.prefix_hits == 0 and eng.stats.prompt_tokens == 12
    b = eng.add_request(SYSTEM + [9], GREEDY)  # the first two blocks (8 tokens) are a's
    c = eng.add_request(SYSTEM[:8], GREEDY)  # all 8 tokens cached, but the last must run: one block reused
    eng.run_all()
    assert eng.stats.prefix_hits == 8 + 4
    assert eng.stats.prompt_tokens == 12 + (11 - 8) + (8 - 4)
    for r in (a, b, c):
        assert r.output == recompute(m, r.prompt, 5)
    assert len(eng.cache.free_blocks) == 64


def test_blocks_are_shared_while_in_use_and_kept_after(model):
    m = model("qwen3")
    eng = engine(m)
    first = eng.add_request(SYSTEM + [1], GREEDY)
    eng.step()  # prefilled: its two full prompt blocks are indexed
    second = eng.add_request(SYSTEM + [2], GREEDY)
    eng.step()
    shared = eng.cache.tables[first.id][:2]
    assert eng.cache.tables[second.id][:2] == shared and all(eng.cache.refs[b] == 2 for b in shared)
    eng.run_all()
    assert all(eng.cache.refs[b] == 0 for b in shared) and all(b in eng.cache.hash_of for b in shared)
    third = eng.add_request(SYSTEM + [3], GREEDY)
    eng.run_all()
    assert [r.output for r in (first, second, third)] == [recompute(m, r.prompt, 5) for r in (first, second, third)]
    assert eng.stats.prefix_hits == 16


def test_evicted_blocks_are_not_hit(model):
    m = model("qwen3")
    eng = engine(m, blocks=8)
    eng.add_request(SYSTEM + [1], GREEDY)
    eng.run_all()
    for p in ([300 + i for i in range(13)], [400 + i for i in range(13)]):  # 18 tokens each: every free block reused
        eng.add_request(p, GREEDY)
        eng.run_all()
    late = eng.add_request(SYSTEM + [2], GREEDY)
    eng.run_all()
    assert eng.stats.prefix_hits == 0 and late.output == recompute(m, late.prompt, 5)


def test_no_hits_when_off_or_for_prompt_logprobs(model):
    m = model("qwen3")
    for caching, params in ((False, GREEDY), (True, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=1, logprobs=1))):
        eng = engine(m, caching=caching)
        eng.add_request(SYSTEM + [1], GREEDY)
        eng.run_all()
        r = eng.add_request(SYSTEM + [2], params)
        eng.run_all()
        assert eng.stats.prefix_hits == 0
        assert r.output == recompute(m, r.prompt, params.max_tokens)
        if params.prompt_logprobs is not None:
            assert len(r.prompt_logprobs) == len(r.prompt)


def test_preempted_requests_recompute_from_their_own_cached_blocks(model):
    m = model("gpt-oss")
    prompts = [SYSTEM + [i] * 5 for i in (1, 2, 3)]
    eng = engine(m, blocks=10, budget=6)
    reqs = [eng.add_request(p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)) for p in prompts]
    eng.run_all()
    assert eng.stats.preemptions > 0 and eng.stats.prefix_hits > 0
    assert [r.output for r in reqs] == [recompute(m, p, 8) for p in prompts]


def test_a_block_is_found_only_after_the_same_tokens_before_it(model):
    """Block keys chain everything before them: [X] at the start of a prompt is not the [X] that followed [A]."""
    m = model("qwen3")
    eng = engine(m)
    a, x = [11, 12, 13, 14], [21, 22, 23, 24]
    eng.add_request(a + x + [1], GREEDY)
    eng.run_all()
    r = eng.add_request(x + [2, 3], GREEDY)
    eng.run_all()
    assert eng.stats.prefix_hits == 0 and r.output == recompute(m, r.prompt, 5)
