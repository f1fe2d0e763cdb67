"""DP attention groups behind one front end (:mod:`quantkit.serve.dp`): 4 ranks as DP 2 x TP 2 and DP 4 x TP 1,
each EP 4, serve Qwen3-MoE, GPT-OSS and DeepSeek-V3 with the unsharded model's greedy tokens and echoed
logprobs (float32, activations unquantized).  The judge is the whole checkpoint's cache-less forward in this
process.  A lone request leaves the other groups idle (they join each MoE exchange with no tokens); a batch of
six sequences reaches every group (each rank reports the steps its group had tokens in); a killed rank ends
every other process with a clear error; two ``torchrun --nnodes 2`` launches on loopback serve as one
(about as long as one 4-rank case, so in the default run)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

from quantkit.serve.text import ModelText
from quantkit.shard import shard

from .test_distributed import N, PROMPTS, check_choices, free_port, judge, launch, post

CASES = [(f, tp) for f in ("qwen3-moe", "gpt-oss", "deepseek-v3") for tp in (2, 1)]


def sharded(ckpt, model, tmp_path, family: str, ep: int, tp: int):
    """(shard dir, source, judge model): DeepSeek's tiny FP8 tiles cannot be cut by TP, its bf16 conversion can."""
    src, whole = ckpt(family), model(family)
    if family == "deepseek-v3" and tp > 1:
        from quantkit.converters import ConvertOptions, convert
        from quantkit.engine import load

        convert(src, tmp_path / "bf16", ConvertOptions(to="bf16"))
        src = tmp_path / "bf16"
        whole = load(src, dtype=torch.float32, act_quant=False)
    dst = tmp_path / "ep2"  # launch() reads the served name "ep2" from rank 0's first line
    shard(src, dst, ep=ep, tp=tp)
    return dst, src, whole


def url_of(proc: subprocess.Popen) -> str:
    line = proc.stderr.readline()
    m = re.search(r"serving \S+ on (http://\S+) ", line)
    assert m, line + proc.stderr.read()
    return m.group(1)


def busy_steps(proc: subprocess.Popen) -> int:
    """A rank's report at exit: the steps in which its DP group had tokens (its KV cache must be empty again:
    every sequence its group ran was released on rank 0's word)."""
    err = proc.stderr.read()
    m = re.search(r"stopped after (\d+) steps with its group's tokens, (\d+) KV blocks held", err)
    assert m and m.group(2) == "0", err[-3000:]
    return int(m.group(1))


@pytest.mark.parametrize("family,tp", CASES, ids=[f"{f}-dp{4 // t}-tp{t}" for f, t in CASES])
def test_dp_groups_serve_the_whole_models_tokens(ckpt, model, tmp_path, family, tp):
    dst, src, whole = sharded(ckpt, model, tmp_path, family, 4, tp)
    procs = launch(dst, 4)
    try:
        url, text = url_of(procs[0]), ModelText(src, whole.config)
        alone = post(url + "/v1/completions", {"prompt": PROMPTS[2], "max_tokens": N, "temperature": 0, "ignore_eos": True,
                                               "logprobs": 0})  # one sequence: the other groups idle
        assert [text.token_str(t) for t in judge(whole, PROMPTS[2], {})[0]] == alone["choices"][0]["logprobs"]["tokens"]
        body = {"prompt": PROMPTS, "max_tokens": N, "temperature": 0, "ignore_eos": True, "n": 2, "echo": True, "logprobs": 1}
        check_choices(post(url + "/v1/completions", body), whole, text, {})  # six sequences over the groups
        procs[0].send_signal(signal.SIGTERM)
        assert [p.wait(timeout=60) for p in procs] == [0] * 4
        steps = {r: busy_steps(p) for r, p in enumerate(procs) if r}
        groups = {r // tp for r, n in steps.items() if n > 0}
        assert groups == {r // tp for r in steps}, steps  # every group with a rank > 0 had tokens in some step
    finally:
        for p in procs:
            p.kill()
            p.stderr.close()


def test_a_killed_rank_ends_every_process_with_a_clear_error(ckpt, model, tmp_path):
    dst, _, _ = sharded(ckpt, model, tmp_path, "qwen3-moe", 4, 1)
    procs = launch(dst, 4, ("--dist-timeout", "8"))
    try:
        url = url_of(procs[0])
        post(url + "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 2})
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait(timeout=30)
        t0 = time.monotonic()
        with pytest.raises((urllib.error.HTTPError, urllib.error.URLError, ConnectionError)):
            post(url + "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 2})
        codes = {r: p.wait(timeout=60) for r, p in enumerate(procs) if r != 2}
        assert time.monotonic() - t0 < 60
        assert codes == {0: 1, 1: 1, 3: 1}, codes
        err = procs[0].stderr.read()
        assert "Error: a sharded step failed, serving stops" in err or "Error: a rank stopped answering" in err, err[-3000:]
        for r in (1, 3):
            assert f"rank {r}: sharded serving lost rank 0 or another rank" in procs[r].stderr.read()
    finally:
        for p in procs:
            p.kill()
            p.stderr.close()


def test_the_front_end_spreads_requests_by_load(model):
    """Fewest running + waiting sequences first, then most free KV blocks; aborts and counters per group."""
    from quantkit.engine.kv_cache import KVCache
    from quantkit.serve.dp import DPEngine
    from quantkit.serve.sampling import SamplingParams
    from quantkit.serve.scheduler import LLMEngine

    m = model("qwen3-moe")
    engines = [LLMEngine(m, 8, 16, max_model_len=64)] + [LLMEngine(m, 8, 16, max_model_len=64, cache=KVCache([], n, 16))
                                                          for n in (16, 12)]
    front = DPEngine(engines, None, 1, idle_tick_s=1.0)
    params = SamplingParams(max_tokens=2, temperature=0.0)
    reqs = [front.add_request([1, 2, 3], params) for _ in range(4)]
    assert [front.group_of[r] for r in reqs] == [1, 2, 0, 1]  # equal loads: the most free blocks first
    assert [len(e.waiting) for e in engines] == [1, 2, 1] and len(front.waiting) == 4
    front.abort(reqs[1])
    assert reqs[1].finish_reason == "abort" and reqs[1] not in engines[2].waiting
    assert front.stats.finished == {"abort": 1}


def test_two_torchrun_nodes_on_loopback_serve_as_one(ckpt, model, tmp_path):
    """``torchrun --nnodes 2 --nproc-per-node 2`` twice (node ranks 0 and 1): DP 4 x TP 1 over both 'nodes'."""
    dst, src, whole = sharded(ckpt, model, tmp_path, "gpt-oss", 4, 1)
    port = str(free_port())
    serve = ["-m", "quantkit", "serve", str(dst), "--device", "cpu", "--dtype", "float32", "--no-act-quant", "--port", "0",
             "--kv-cache-gib", "0.01", "--max-model-len", "128", "--max-num-batched-tokens", "8"]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                               "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", port, *serve],
                              stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    try:
        lines = []
        while not any("serving ep2 on" in s for s in lines):
            lines.append(nodes[0].stderr.readline())
            assert lines[-1], "".join(lines)
        url = re.search(r"serving \S+ on (http://\S+) ", lines[-1]).group(1)
        body = {"prompt": PROMPTS, "max_tokens": N, "temperature": 0, "ignore_eos": True, "n": 2, "echo": True, "logprobs": 1}
        check_choices(post(url + "/v1/completions", body), whole, ModelText(src, whole.config), {})
    finally:
        for p in nodes:
            p.send_signal(signal.SIGTERM)
        for p in nodes:
            p.wait(timeout=60)  # both launches end (no rank left waiting)
            p.stderr.close()


@contextlib.contextmanager
def served(dst, extra: tuple[str, ...]):
    """Four ranks serving ``dst`` (rank 0's URL); on leaving the block rank 0 gets SIGTERM and every rank
    must exit 0."""
    procs = launch(dst, 4, extra)
    try:
        yield url_of(procs[0])
        procs[0].send_signal(signal.SIGTERM)
        assert [p.wait(timeout=60) for p in procs] == [0] * 4
    finally:
        for p in procs:
            p.kill()
            p.stderr.close()


@pytest.mark.parametrize("family,tp", CASES, ids=[f"{f}-dp{4 // t}-tp{t}" for f, t in CASES])
def test_all_to_all_exchange_serves_the_whole_models_tokens(ckpt, model, tmp_path, family, tp):
    """--ep-exchange all-to-all: prefill steps with variable splits, decode steps at fixed capacity (the
    batch fits max_num_seqs), both giving the whole model's greedy tokens and echoed log-probs."""
    dst, src, whole = sharded(ckpt, model, tmp_path, family, 4, tp)
    with served(dst, ("--ep-exchange", "all-to-all", "--max-num-seqs", "8")) as url:
        text = ModelText(src, whole.config)
        body = {"prompt": PROMPTS, "max_tokens": N, "temperature": 0, "ignore_eos": True, "n": 2, "echo": True, "logprobs": 1}
        check_choices(post(url + "/v1/completions", body), whole, text, {})
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            metrics = r.read().decode()
        got = {m.group(1): float(m.group(2)) for m in re.finditer(r'quantkit:ep_(\w+)_total\{[^}]*\} (\S+)', metrics)}
        assert got["dispatch_bytes_sent"] > 0 and got["combine_bytes_received"] > 0 and got["exchange_layer_calls"] > 0, got


def test_all_to_all_fp8_payload_keeps_the_served_numerics(ckpt, tmp_path):
    """Activation quantization on (float32): DeepSeek-V3's fp8-block experts get their rows as E4M3 + 1x128
    scales, quantized once by the sender. The judge is the whole model with the same quantization, on the
    served sequence (prompt, then the generated tokens while they are the judge's greedy ones): every
    log-prob agrees to float32 rounding (median below 1e-4) and, where a summation-order difference crosses
    an E4M3 rounding boundary, within 0.2 nats (tests/serve/test_step_consistency.py states the same bound
    for the single process)."""
    from quantkit.engine import load, prefill_logits

    src = ckpt("deepseek-v3")
    whole = load(src, dtype=torch.float32, act_quant=True)
    text = ModelText(src, whole.config)
    dst = tmp_path / "ep2"
    shard(src, dst, ep=4, tp=1)
    with served(dst, ("--ep-exchange", "all-to-all", "--act-quant")) as url:
        body = {"prompt": PROMPTS, "max_tokens": N, "temperature": 0, "ignore_eos": True, "echo": True, "logprobs": 0}
        diffs = []
        for p, c in zip(PROMPTS, post(url + "/v1/completions", body)["choices"]):
            seq = p + judge(whole, p, {})[0]
            strs = [text.token_str(t) for t in seq]
            same = next((i for i, (a, b) in enumerate(zip(strs, c["logprobs"]["tokens"])) if a != b), len(seq))
            assert same > len(p), (p, c["logprobs"]["tokens"])  # the prompt is echoed as sent
            lp = torch.log_softmax(prefill_logits(whole, [seq])[0][:-1], -1).gather(1, torch.tensor(seq[1:]).view(-1, 1)).view(-1)
            diffs += [abs(a - b) for a, b in zip(c["logprobs"]["token_logprobs"][1:same], lp.tolist())]
        d = torch.tensor(diffs)
        assert len(diffs) >= sum(len(p) - 1 for p in PROMPTS) and d.median() < 1e-4 and d.max() < 0.2, diffs
