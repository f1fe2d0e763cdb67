"""One request fails only itself: sampling parameters the sampler cannot take exactly are made exact or
refused, a request that fails inside a step ends alone (the batch goes on), a request refused after
some of its sequences were queued leaves none behind, and admission is fair across client requests."""

from __future__ import annotations

import threading
import time

import pytest

from quantkit.serve import sampling
from quantkit.serve.sampling import SamplingParams
from quantkit.serve.scheduler import LLMEngine

from .test_http import call, server  # noqa: F401  (the module's running server fixture)
from .test_scheduler import recompute


def idle(s) -> bool:
    """No sequence running or waiting, every KV block free, and /metrics says so."""
    text = call(s, "/metrics")[1]
    running = next(ln for ln in text.splitlines() if ln.startswith("quantkit:num_requests_running"))
    return (not s.engine.running and not s.engine.waiting and float(running.split()[-1]) == 0
            and len(s.engine.cache.free_blocks) == s.engine.cache.num_blocks)


@pytest.mark.parametrize("temperature", [1e-300, 1e-45, 1e-6])
def test_a_temperature_below_the_floor_is_greedy(server, model, temperature):  # noqa: F811
    s = server("qwen3")
    ids = [11, 12, 13]
    status, r = call(s, "/v1/completions", {"prompt": ids, "max_tokens": 5, "temperature": temperature, "ignore_eos": True})
    assert status == 200 and r["choices"][0]["text"] == s.text.decode(recompute(model("qwen3"), ids, 5))
    assert SamplingParams(temperature=temperature).greedy and not SamplingParams(temperature=1e-5).greedy


def test_a_request_that_fails_mid_batch_fails_alone(server, model, monkeypatch):  # noqa: F811
    """Its sampler raises at its third token while another client's request shares its batches: that one gets
    a 500 naming the failure (its other choice aborted), the other its whole greedy continuation."""
    s = server("qwen3")
    real, seen = sampling.prepare_row, []

    def prepare_row(row, d):  # the sampler's per-request step
        if d.params.seed in (666, 667):
            seen.append(len(s.engine.running))
            if len(d.output) >= 2:
                raise RuntimeError("sampler blew up")
        return real(row, d)

    real_step, together = s.engine.step, threading.Event()

    def step():  # the engine waits until all three sequences are there, so they share their batches
        if not together.is_set() and len(s.engine.waiting) + len(s.engine.running) < 3:
            time.sleep(0.005)
            return []
        together.set()
        return real_step()

    monkeypatch.setattr(sampling, "prepare_row", prepare_row)
    monkeypatch.setattr(s.engine, "step", step)
    ids, got = [40, 41, 42], {}

    def client(name: str, body: dict) -> None:
        got[name] = call(s, "/v1/completions", body)

    a = threading.Thread(target=client, args=("a", {"prompt": ids, "max_tokens": 40, "temperature": 0, "ignore_eos": True}))
    b = threading.Thread(target=client, args=("b", {"prompt": [7, 8], "max_tokens": 10, "temperature": 0.5, "seed": 666,
                                                     "n": 2, "ignore_eos": True}))
    for t in (a, b):
        t.start()
    for t in (a, b):
        t.join(timeout=120)
    assert got["b"][0] == 500 and "the engine failed on this request: RuntimeError: sampler blew up" in got["b"][1]["error"]["message"]
    assert max(seen) == 3  # the failing request's two choices and the other client's request shared a batch
    assert got["a"][0] == 200 and got["a"][1]["choices"][0]["text"] == s.text.decode(recompute(model("qwen3"), ids, 40))
    assert s.engine.stats.finished.get("error", 0) >= 1 and idle(s)


def test_a_refused_request_leaves_no_sequence_behind(server, monkeypatch):  # noqa: F811
    """Its second sequence cannot be queued: the first, queued already, is taken back (it ran on with no client)."""
    s = server("qwen3")
    real, calls = s.engine.add_request, []

    def add_request(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise OverflowError("no room")
        return real(*a, **k)

    monkeypatch.setattr(s.engine, "add_request", add_request)
    status, r = call(s, "/v1/completions", {"prompt": "x", "n": 2, "max_tokens": 50, "ignore_eos": True})
    assert status == 500 and "could not take the request: no room" in r["error"]["message"]
    assert idle(s)


def test_seeds_at_the_top_of_their_range_and_ids_outside_the_vocabulary(server):  # noqa: F811
    s = server("qwen3")
    status, r = call(s, "/v1/completions", {"prompt": "x", "n": 2, "seed": 2**64 - 1, "temperature": 0.7, "max_tokens": 3})
    assert status == 200 and len(r["choices"]) == 2 and idle(s)
    status, r = call(s, "/v1/completions", {"prompt": "x", "stop_token_ids": [10**7], "min_tokens": 1, "max_tokens": 2})
    assert status == 400 and "stop_token_ids id 10000000 is outside the vocabulary" in r["error"]["message"]


def steps_until_small_finishes(model, same_group: bool) -> int:
    """Steps until a one-sequence request, arriving after a 16-sequence one, finishes (4 seats, 20 tokens each)."""
    eng = LLMEngine(model, 64, 8, max_num_seqs=4, max_num_batched_tokens=64)
    big = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    for i in range(16):
        eng.add_request([5 + i, 6], big, group="big")
    small = eng.add_request([9, 10], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), group="big" if same_group else None)
    steps = 0
    while not small.finished:
        eng.step()
        steps += 1
    return steps


def test_a_request_of_many_sequences_cannot_starve_a_single_one(model):
    """The small one enters at the first free seat: within one big sequence's length plus its own (the bound
    below); in the big request's group it would wait for three more rounds of the big one (first come first served)."""
    assert steps_until_small_finishes(model("qwen3"), same_group=False) <= 20 + 1 + 5
    assert steps_until_small_finishes(model("qwen3"), same_group=True) > 3 * 20
