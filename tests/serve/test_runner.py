"""The graphed decode step's data path, checked on the CPU: static buffers, padded batch-size buckets,
the scratch block of the padding rows, block tables copied at the step's width, the LM head and the
argmax in the compute dtype.  ``ModelRunner(static=True)`` runs exactly what a CUDA graph records, only
eagerly; the GPU tests (tests/serve/test_gpu.py) replay the captured graphs against a prefill.

The judge is the eager engine on the same requests, float32 with activations unquantized: both compute
the same function up to float32 summation order (a GEMM's M differs with the padding rows), so every
greedy token agrees and the log-probs agree to 1e-4.  (With FP8 activation quantization a summation-order
difference can cross an E4M3 rounding boundary and move a log-prob by up to 0.2 nats, enough to flip a
near-tie: tests/serve/test_step_consistency.py.)
Budget: under 30 s on 2 cores.
"""

from __future__ import annotations

import pytest
import torch

from quantkit.engine import load
from quantkit.engine.runner import ModelRunner, StagedTables, eager_reason, graph_buckets
from quantkit.serve.sampling import SamplingParams
from quantkit.serve.scheduler import LLMEngine

BLOCKS, MAX_SEQS = 48, 5


def run(m, static: bool) -> tuple[LLMEngine, list]:
    # budget 3 later: a step holds two decodes and a one-token prefill chunk that is not sampled (rows a subset);
    # three sequences pad to the bucket of 4
    eng = LLMEngine(m, num_blocks=BLOCKS, block_size=16, max_num_seqs=MAX_SEQS, max_num_batched_tokens=40)
    if static:
        eng.runner = ModelRunner(m, eng.cache, MAX_SEQS, eng.max_model_len, static=True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1900, (n,), generator=g).tolist() for n in (33, 16, 1, 17, 40)]
    lp = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)
    reqs = [eng.add_request(p, lp if i % 2 else SamplingParams(max_tokens=10 + i, temperature=0, ignore_eos=True))
            for i, p in enumerate(prompts[:3])]
    for _ in range(4):
        eng.step()
    reqs += [eng.add_request(p, lp) for p in prompts[3:]]  # arrive while the others decode
    eng.max_num_batched_tokens = 3
    for _ in range(12):
        eng.step()
    eng.max_num_batched_tokens = 40
    eng.run_all()
    return eng, reqs


@pytest.mark.parametrize("family", ["gpt-oss", "deepseek-v3", "qwen3-moe", "qwen3"])
def test_static_decode_path_equals_eager(model, family):
    m = model(family)
    eager, ref = run(m, static=False)
    static, got = run(m, static=True)
    assert eager.runner.replays == 0 and static.runner.replays >= 15, (eager.runner.replays, static.runner.replays)
    for r, e in zip(got, ref):
        assert r.output == e.output, (family, r.id)
        for a, b in zip(r.logprobs, e.logprobs):
            assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-4, (family, r.id, a, b)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    # the scratch block was never handed to a sequence, and every other block came back
    scratch = static.runner.scratch
    assert scratch is not None and static.cache.refs[scratch] == 1
    assert len(static.cache.free_blocks) == BLOCKS - 1 and len(eager.cache.free_blocks) == BLOCKS


def test_buckets_and_eager_reasons(ckpt):
    assert graph_buckets(1) == [1]
    assert graph_buckets(5) == [1, 2, 4, 5]
    assert graph_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    m = load(ckpt("qwen3"), "cpu", torch.float32)
    cache = m.new_cache(4, 16)
    assert "CUDA" in eager_reason(m, cache)
    r = ModelRunner(m, cache, 8, 64)
    assert not r.graphed and r.scratch is None and len(cache.free_blocks) == 4
    forced = ModelRunner(m, cache, 8, 64, enforce_eager=True, static=True)
    assert forced.why_eager == "enforce_eager" and not forced.buckets


def test_staged_tables_equal_the_tables_written_whole():
    """StagedTables keeps the staging buffer from step to step; every step the device tables must hold what writing
    each table whole, padded with the scratch block to the stride, gives: through growth, finished sequences (rows move up),
    a row moving down, new and re-admitted sequences (a new table list in the same place), and stride changes."""
    width, scratch = 40, 999
    device = torch.full((8, width), -1, dtype=torch.int64)  # the device tables (here on the CPU)
    staged = StagedTables(torch.zeros(8 * width, dtype=torch.int64), device, scratch)
    g = torch.Generator().manual_seed(0)
    rand = lambda n: int(torch.randint(0, n, (), generator=g))  # noqa: E731
    tables, nxt = {}, iter(range(10**6))
    for step in range(400):
        if len(tables) < 8 and rand(3) == 0:  # arrives (sometimes long: the stride grows past 16)
            tables[f"s{rand(10)}" if rand(2) else f"n{step}"] = [next(nxt) for _ in range(1 + rand(30))]
        if tables and rand(6) == 0:  # finishes: the rows after it move up
            del tables[list(tables)[rand(len(tables))]]
        if len(tables) > 1 and rand(10) == 0:  # the first goes last: it moves down, the others up
            first = next(iter(tables))
            tables[first] = tables.pop(first)
        for t in tables.values():
            if rand(4) == 0 and len(t) < width:
                t.append(next(nxt))
        if not tables:
            continue
        staged.update(list(tables.values()))
        stride = min(-(-max(map(len, tables.values())) // 16) * 16, width)
        want = torch.tensor([t + [scratch] * (stride - len(t)) for t in tables.values()])
        assert torch.equal(device[: len(tables), :stride], want), step


def test_lookahead_steps_give_the_sync_steps_tokens(model):
    """The scheduler's lookahead (LLMEngine.step): graphed decode steps of plain-greedy requests launched one
    ahead, their tokens gathered on the device from the step before.  The same tokens as stepping in sync, for
    requests that end by their length (left out of the step ahead), by a stop id seen one step late (the row
    computed ahead is dropped), by an abort while two steps are in flight, and for a sampled request, which
    takes the sync path; every block comes back."""
    m = model("gpt-oss")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1900, (n,), generator=g).tolist() for n in (9, 20, 3, 14)]

    def go(lookahead: bool, stop: int | None):
        eng = LLMEngine(m, num_blocks=BLOCKS, block_size=4, max_num_seqs=MAX_SEQS, lookahead=lookahead)
        eng.runner = ModelRunner(m, eng.cache, MAX_SEQS, eng.max_model_len, static=True)
        ahead = []
        launch = eng._launch_ahead
        eng._launch_ahead = lambda prev: ahead.append(launch(prev)) or ahead[-1]
        greedy = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, stop_token_ids=() if stop is None else (stop,))
                  for n in (12, 5, 9)]  # fmt: skip
        reqs = [eng.add_request(p, s) for p, s in zip(prompts, greedy)]
        victim = eng.add_request(prompts[3], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
        for i in range(40):
            if i == 6:
                eng.abort(victim)
            if i == 8:  # a sampled request arrives: the next step waits for the host, then runs in sync
                reqs.append(eng.add_request(prompts[0], SamplingParams(max_tokens=4, temperature=0.8, seed=5, ignore_eos=True)))
            eng.step()
        eng.run_all()
        assert victim.finish_reason == "abort" and len(eng.cache.free_blocks) == BLOCKS - 1 and not eng.cache.tables
        return [(r.output, r.finish_reason) for r in reqs], sum(a is not None for a in ahead)

    sync, n_sync = go(False, None)
    assert n_sync == 0
    got, n = go(True, None)
    assert got == sync and n >= 5, n
    stop = sync[0][0][3]  # request 0's fourth token as a stop id: it ends while its next step is in flight
    sync, _ = go(False, stop)
    got, n = go(True, stop)
    assert got == sync and sync[0][1] == "stop" and len(sync[0][0]) == 4 and n >= 4
