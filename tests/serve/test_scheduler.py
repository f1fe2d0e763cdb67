"""The continuous-batching engine against cache-less recomputation.

The judge of every generated token is :func:`prefill_logits` on the whole sequence so far (no KV
cache, no batching, no chunking): greedy decoding through the engine must give its argmax at every
step, whatever the token budget (chunked prefill), the KV cache size (preemption and recompute),
the arrival order, or the other requests in the batch.
"""

from __future__ import annotations

import pytest
import torch

from quantkit.engine import prefill_logits
from quantkit.engine.runner import ModelRunner
from quantkit.serve.sampling import SamplingParams
from quantkit.serve.request import RequestError
from quantkit.serve.scheduler import LLMEngine

PROMPTS = [[5, 17, 301, 44, 9, 1200, 77, 3, 18, 250, 61, 14, 900], [40, 41, 42, 43, 44, 45], [7]]
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def recompute(model, prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = int(prefill_logits(model, [seq])[0][-1].argmax())
        out.append(t)
        seq.append(t)
    return out


@pytest.fixture(scope="module")
def expected(model):
    got = {}

    def get(family):
        if family not in got:
            got[family] = [recompute(model(family), p, GREEDY.max_tokens) for p in PROMPTS]
        return got[family]

    return get


@pytest.mark.parametrize("family", ["qwen3", "gpt-oss", "deepseek-v3", "qwen3-moe"])
@pytest.mark.parametrize("budget,blocks", [(1000, 64), (5, 64), (1, 64), (6, 7)])
def test_greedy_equals_recomputation(model, expected, family, budget, blocks):
    """budget 5 / 1: prompts prefilled in chunks across steps; 7 blocks of 4: requests preempted and recomputed."""
    eng = LLMEngine(model(family), num_blocks=blocks, block_size=4, max_num_batched_tokens=budget)
    reqs = [eng.add_request(p, GREEDY) for p in PROMPTS]
    eng.run_all()
    assert [r.output for r in reqs] == expected(family)
    assert all(r.finish_reason == "length" for r in reqs)
    assert len(eng.cache.free_blocks) == blocks  # every block came back
    if blocks == 7:
        assert eng.stats.preemptions > 0
    if budget == 1:
        assert eng.stats.steps >= sum(len(p) for p in PROMPTS)


def test_late_arrivals_join_the_running_batch(model, expected):
    eng = LLMEngine(model("qwen3"), num_blocks=64, block_size=4, max_num_batched_tokens=8)
    first = eng.add_request(PROMPTS[0], GREEDY)
    eng.step()
    eng.step()
    later = [eng.add_request(p, GREEDY) for p in PROMPTS[1:]]
    mixed = eng.step()  # one batch with a decode or prefill chunk of the first and the newcomers' prefill
    assert first in mixed and later[0] in mixed
    eng.run_all()
    assert [r.output for r in [first, *later]] == expected("qwen3")


def test_max_num_seqs_bounds_the_batch(model, expected):
    eng = LLMEngine(model("qwen3"), num_blocks=64, block_size=4, max_num_seqs=1)
    reqs = [eng.add_request(p, GREEDY) for p in PROMPTS]
    seen = []
    while eng.has_work():
        seen.append(len(eng.step()))
    assert max(seen) == 1
    assert [r.output for r in reqs] == expected("qwen3")


def test_logprobs_are_the_models_distribution(model):
    m = model("qwen3")
    eng = LLMEngine(m, num_blocks=64, block_size=4)
    r = eng.add_request(PROMPTS[1], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=3))
    eng.run_all()
    seq = PROMPTS[1] + r.output
    ref = torch.log_softmax(prefill_logits(m, [seq])[0], -1)
    for i, e in enumerate(r.logprobs):
        row = ref[len(PROMPTS[1]) - 1 + i]
        assert e.token == r.output[i] and abs(e.logprob - row[e.token].item()) < 1e-4
        top_ids = [t for t, _ in e.top]
        assert top_ids == row.topk(3).indices.tolist() and top_ids[0] == e.token  # greedy picks the top one
        assert all(abs(lp - row[t].item()) < 1e-4 for t, lp in e.top)


@pytest.mark.parametrize("budget", [1000, 4])
def test_prompt_logprobs_score_every_prompt_token(model, budget):
    """echo + logprobs (lm-eval-harness loglikelihood): entry i is log p(prompt[i] | prompt[:i]); the first is None."""
    m = model("qwen3")
    eng = LLMEngine(m, num_blocks=64, block_size=4, max_num_batched_tokens=budget)
    p = PROMPTS[0]
    r = eng.add_request(p, SamplingParams(max_tokens=0, logprobs=2, prompt_logprobs=2))
    eng.run_all()
    assert r.output == [] and r.finish_reason == "length"
    ref = torch.log_softmax(prefill_logits(m, [p])[0], -1)
    assert r.prompt_logprobs[0] is None and len(r.prompt_logprobs) == len(p)
    for i in range(1, len(p)):
        e = r.prompt_logprobs[i]
        assert e.token == p[i] and abs(e.logprob - ref[i - 1, p[i]].item()) < 1e-4
        assert [t for t, _ in e.top] == ref[i - 1].topk(2).indices.tolist()


def test_seeded_sampling_does_not_depend_on_the_batch(model):
    m = model("qwen3")
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=1234, ignore_eos=True)

    def run(companions: int, seed_params=params) -> list[int]:
        eng = LLMEngine(m, num_blocks=64, block_size=4)
        r = eng.add_request(PROMPTS[1], seed_params)
        for i in range(companions):
            eng.add_request(PROMPTS[i % 3], SamplingParams(max_tokens=5 + i, temperature=0.7, seed=i))
        eng.run_all()
        return r.output

    alone = run(0)
    assert run(3) == alone and run(1) == alone
    other = run(0, SamplingParams(max_tokens=8, temperature=1.0, seed=99, ignore_eos=True))
    assert other != alone  # 8 draws over a 2k-token vocabulary at temperature 1


def test_top_k_one_and_tiny_top_p_are_greedy(model, expected):
    for p in (SamplingParams(max_tokens=6, top_k=1, seed=3, ignore_eos=True), SamplingParams(max_tokens=6, top_p=1e-9, seed=3, ignore_eos=True)):
        eng = LLMEngine(model("qwen3"), num_blocks=64, block_size=4)
        reqs = [eng.add_request(q, p) for q in PROMPTS]
        eng.run_all()
        assert [r.output for r in reqs] == expected("qwen3")


def test_eos_and_stop_token_ids_end_a_request(model, expected):
    m = model("qwen3")
    want = expected("qwen3")[0]
    eng = LLMEngine(m, num_blocks=64, block_size=4, eos_ids=(want[2],))
    a = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0))
    b = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, stop_token_ids=(want[4],)))
    c = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    eng.run_all()
    assert a.output == want[:3] and a.finish_reason == "stop" and a.stop_reason is None
    assert b.output == want[:5] and b.finish_reason == "stop" and b.stop_reason == want[4]
    assert c.output == want and c.finish_reason == "length"


def test_requests_that_cannot_run_are_refused(model):
    m = model("qwen3")
    eng = LLMEngine(m, num_blocks=4, block_size=4)  # 16 tokens of cache: the context limit
    assert eng.max_model_len == 16
    with pytest.raises(RequestError, match="maximum context length of 16"):
        eng.add_request(list(range(10)), SamplingParams(max_tokens=7))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        eng.add_request([1, 10**6], SamplingParams())
    with pytest.raises(RequestError, match="empty"):
        eng.add_request([], SamplingParams())
    assert not eng.has_work()


def test_abort_frees_the_cache(model):
    eng = LLMEngine(model("qwen3"), num_blocks=16, block_size=4)
    r = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=8, ignore_eos=True))
    eng.step()
    assert len(eng.cache.free_blocks) < 16
    eng.abort(r)
    assert r.finish_reason == "abort" and len(eng.cache.free_blocks) == 16 and not eng.has_work()


def test_min_tokens_hold_back_every_stop(model):
    """Before min_tokens the end-of-sequence and stop ids cannot be drawn: greedy then takes the best other
    token (the judge: the cache-less argmax with those ids removed), and stops at the first one after."""
    m = model("qwen3")
    free = recompute(m, PROMPTS[1], 6)
    eos, stop_id = free[0], free[1]
    eng = LLMEngine(m, num_blocks=64, block_size=4, eos_ids=(eos,))
    r = eng.add_request(PROMPTS[1], SamplingParams(max_tokens=6, temperature=0, min_tokens=3, stop_token_ids=(stop_id,)))
    eng.run_all()
    seq, want = list(PROMPTS[1]), []
    while len(want) < 6:
        logits = prefill_logits(m, [seq])[0][-1]
        if len(want) < 3:
            logits[[eos, stop_id]] = float("-inf")
        want.append(int(logits.argmax()))
        seq.append(want[-1])
        if len(want) > 3 and want[-1] in (eos, stop_id):
            break
    assert r.output == want and eos not in r.output[:3] and stop_id not in r.output[:3]
    with pytest.raises(ValueError, match="min_tokens must be in"):
        SamplingParams(max_tokens=2, min_tokens=3)


@pytest.mark.parametrize("family", ["gpt-oss", "qwen3-moe"])
def test_warm_up_leaves_the_engine_as_new(model, expected, family):
    """``LLMEngine.warm_up`` (a server's start on a GPU): every kind of step runs, then nothing is left behind --
    no request, no block in use, fresh stats -- and later requests generate what they would have."""
    eng = LLMEngine(model(family), num_blocks=64, block_size=4, max_num_batched_tokens=24, lookahead=True)
    eng.runner = ModelRunner(eng.model, eng.cache, eng.max_num_seqs, eng.max_model_len, static=True)  # steps ahead too
    steps, _ = eng.warm_up()
    assert steps > 7 and not eng.has_work() and eng.ahead is None
    assert eng.kv_usage == 1 / 64 and eng.stats.steps == 0 and not eng.stats.finished  # one block: the graphs' scratch
    reqs = [eng.add_request(p, GREEDY) for p in PROMPTS]
    eng.run_all()
    assert [r.output for r in reqs] == expected(family) and eng.stats.steps > 0
