"""Several HTTP front processes over one engine (``quantkit serve --api-server-count N``): each request is
answered whichever front accepts it, greedy tokens equal a cache-less recomputation (the judge), /metrics
counts every front's requests, and a front that dies stops the server with its error, its requests aborted
and their KV blocks freed.  Budget: under 40 s."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from quantkit.serve.launch import build

from .test_http import call, events
from .test_scheduler import recompute


def make(ckpt, fronts: int = 1):
    return build(str(ckpt("qwen3")), port=0, dtype="float32", act_quant=False, max_model_len=256, kv_cache_gib=0.01,
                 max_num_batched_tokens=64, block_size=8, api_servers=fronts)


def start(ckpt, fronts: int):
    s = make(ckpt, fronts)
    s.start_background()
    return s


def serving(s) -> tuple[threading.Thread, list[BaseException]]:
    """``s.serve()`` in a thread, up when this returns; what it raised lands in the list."""
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            s.serve("warning")
        except BaseException as e:  # noqa: BLE001  (the test reads it)
            errors.append(e)

    thread = threading.Thread(target=serve)
    thread.start()
    assert s._up.wait(60)
    return thread, errors


def idle(s) -> bool:
    return not s.engine.running and not s.engine.waiting and len(s.engine.cache.free_blocks) == s.engine.cache.num_blocks


def test_two_fronts_answer_every_request_as_the_model_does(ckpt, model):
    s = start(ckpt, 2)
    try:
        assert len(s.fronts) == 2 and len({f.pid for f in s.fronts}) == 2
        prompts = [f"Request number {i} says" for i in range(8)]
        want = {p: recompute(model("qwen3"), s.text.encode(p), 6) for p in prompts}

        def one(k: int) -> tuple[str, list[int]]:
            p, body = prompts[k % len(prompts)], {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 0}
            if k % 2:
                chunks = events(s, "/v1/completions", {**body, "prompt": p, "stream": True})
                tokens = [t for c in chunks for ch in c["choices"] for t in (ch["logprobs"] or {}).get("tokens", [])]
            else:
                status, r = call(s, "/v1/completions", {**body, "prompt": p})
                assert status == 200
                tokens = r["choices"][0]["logprobs"]["tokens"]
            return p, tokens

        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(one, range(48)))
        for p, tokens in got:
            assert tokens == [s.text.token_str(t) for t in want[p]], p
        status, text = call(s, "/metrics")
        assert status == 200 and f'quantkit:request_success_total{{model_name="{s.model_name}",finished_reason="length"}} 48' in text
        assert idle(s)
    finally:
        s.close()


def test_a_front_that_dies_stops_the_server_and_frees_its_requests(ckpt, monkeypatch):
    from quantkit.serve.server import STOPPED

    s = make(ckpt, 2)
    server, errors = serving(s)
    held, real = threading.Event(), s.engine.step

    def step():  # the first step waits until the test has killed a front
        held.wait(30)
        return real()

    monkeypatch.setattr(s.engine, "step", step)
    answers: list = []

    def ask() -> None:
        try:
            answers.append(call(s, "/v1/completions", {"prompt": "x", "max_tokens": 50, "ignore_eos": True})[0])
        except OSError as e:  # its front was killed under it
            answers.append(e)

    client = threading.Thread(target=ask)
    client.start()
    deadline = time.monotonic() + 30
    while not (s.engine.waiting or s.engine.running) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(s.fronts[0].pid, signal.SIGKILL)  # the request is on either: killed with it, or stopped by the server
    held.set()
    server.join(timeout=60)
    assert not server.is_alive() and len(errors) == 1 and "exited with status -9" in str(errors[0])
    assert s.fronts[0].returncode == -signal.SIGKILL and s.fronts[1].returncode in STOPPED
    assert idle(s) and s.engine.stats.finished.get("abort", 0) == 1
    client.join(timeout=30)
    assert len(answers) == 1 and answers[0] != 200  # a reset, or the stopping front's error
    s.server_close()


def test_an_engine_thread_that_fails_stops_the_server_with_its_error(ckpt, monkeypatch):
    from quantkit.serve.request import EngineBroken
    from quantkit.serve.server import STOPPED

    s = make(ckpt)
    server, errors = serving(s)

    def has_work():
        raise RuntimeError("a bug in the engine's loop")

    monkeypatch.setattr(s.engine, "has_work", has_work)
    server.join(timeout=60)
    assert not server.is_alive() and len(errors) == 1 and isinstance(errors[0], EngineBroken)
    assert "a bug in the engine's loop" in str(errors[0]) and all(f.returncode in STOPPED for f in s.fronts)
    s.server_close()


def test_a_front_count_below_one_is_refused(ckpt):
    with pytest.raises(ValueError, match="api_servers"):
        build(str(ckpt("qwen3")), port=0, dtype="float32", max_model_len=64, kv_cache_gib=0.01, api_servers=0)
