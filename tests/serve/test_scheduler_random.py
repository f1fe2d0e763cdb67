"""Random workloads through the engine (hypothesis): arrivals between steps, prompts sharing prefixes,
token budgets, cache sizes that force preemption, prefix caching on and off, aborts.  Whatever
happens, every request that was not aborted ends with its greedy recomputation, and the cache ends
empty: every block free, no reference left, every table released."""

from __future__ import annotations

import os
from functools import lru_cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantkit.engine.runner import ModelRunner
from quantkit.serve.sampling import SamplingParams
from quantkit.serve.scheduler import LLMEngine

from .test_scheduler import recompute

BASES = [[5, 6, 7, 8, 9, 10, 11, 12], [300, 301, 302, 303, 304], [900]]
SEARCH = os.environ.get("QK_EXAMPLES")  # set (e.g. 1500) to search new random workloads; unset, CI replays the same 150
EXAMPLES = int(SEARCH or 150)

request = st.tuples(st.integers(0, 2), st.lists(st.integers(0, 1899), min_size=0, max_size=9), st.integers(1, 6),
                    st.integers(0, 3), st.booleans())  # base, suffix, max_tokens, arrival step, aborted after arriving
workload = st.tuples(st.lists(request, min_size=1, max_size=6), st.sampled_from([1, 3, 7, 64]), st.integers(9, 24),
                     st.booleans(), st.sampled_from([1, 2, 8]))  # requests, token budget, blocks of 4, prefix caching, max seqs


@settings(max_examples=EXAMPLES, deadline=None, derandomize=SEARCH is None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(workload)
def test_any_workload_gives_each_request_its_recomputation(model, case):
    run_workload(model("qwen3"), case, static=False)


@settings(max_examples=EXAMPLES // 3, deadline=None, derandomize=SEARCH is None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(workload)
def test_any_workload_on_the_graphed_decode_path(model, case):
    """The same workloads with decode steps on the CUDA-graph path's data (static buffers, padded buckets, the
    scratch block, block tables kept from step to step), run eagerly on the CPU, and launched ahead where they can
    be (the scheduler's lookahead): preemption, prefix-cache hits, aborts and batches that shrink and grow move
    sequences between rows."""
    run_workload(model("qwen3"), case, static=True)


def run_workload(m, case, static: bool) -> None:
    @lru_cache(maxsize=None)
    def judge(prompt: tuple[int, ...], n: int) -> list[int]:
        return recompute(m, list(prompt), n)

    reqs, budget, blocks, caching, max_seqs = case
    eng = LLMEngine(m, num_blocks=blocks + static, block_size=4, max_num_batched_tokens=budget, max_num_seqs=max_seqs, prefix_caching=caching,
                    lookahead=static)  # fmt: skip
    if static:  # one more block: the graphed path reserves it for the padding rows
        eng.runner = ModelRunner(m, eng.cache, max_seqs, eng.max_model_len, static=True)
    pending = sorted(enumerate(reqs), key=lambda x: x[1][3])
    live, step = [], 0
    while pending or eng.has_work():
        while pending and pending[0][1][3] <= step:
            _, (base, suffix, n, _, abort) = pending.pop(0)
            prompt = BASES[base] + suffix
            r = eng.add_request(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
            live.append((r, abort))
        eng.step()
        for r, abort in live:
            if abort and not r.finished and step % 2:
                eng.abort(r)
        step += 1
        assert step < 500
    for r, _ in live:
        if r.finish_reason == "abort":
            continue
        assert r.finish_reason == "length" and r.output == judge(tuple(r.prompt), r.params.max_tokens)
    scratch = eng.runner.scratch
    assert len(eng.cache.free_blocks) == blocks and not eng.cache.tables
    assert not any(r for b, r in enumerate(eng.cache.refs) if b != scratch) and (scratch is None or eng.cache.refs[scratch] == 1)
