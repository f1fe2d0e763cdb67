"""Serving ``quantkit shard`` outputs, expert and tensor parallel: one process per rank (gloo on the
CPU, as torchrun launches them), rank 0 serving HTTP.  The judge is the unsharded checkpoint: greedy tokens,
echoed prompt logprobs and ``logit_bias`` equal cache-less forwards of the whole model in this process, for
prompt ids from the whole vocabulary (a TP rank holds half of its embedding rows) and ``n = 2``, for a
per-expert family (Qwen3-MoE), GPT-OSS's fused experts, DeepSeek-V3 (shared expert, a dense first layer; its
MTP layer is loaded from its shard) and dense Qwen3 (tensor parallel alone)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
import torch

from quantkit.engine import prefill_logits
from quantkit.serve.text import ModelText
from quantkit.shard import shard


# ids from the whole vocabulary (2048): a TP rank's embedding holds only half of it
PROMPTS = [[5, 6, 7, 8], [1900, 12, 1066], [33] * 5 + [2047, 1500, 1024, 1023]]
BIAS = {1777: 8.0, 1066: -100.0}  # logit_bias at ids in the upper half of the vocabulary
N = 4  # tokens generated per choice


def judge(whole, prompt: list[int], bias: dict[int, float]) -> tuple[list[int], list[float | None]]:
    """Greedy tokens of argmax(logits + bias) from cache-less forwards of the whole model, and the raw
    logprobs of prompt and generated tokens (the first prompt token has none)."""
    seq, lps = list(prompt), []
    for i in range(N):
        logits = prefill_logits(whole, [seq])[0]
        if i == 0:
            lp = torch.log_softmax(logits[:-1], -1)
            lps = [None] + lp.gather(1, torch.tensor(seq[1:]).view(-1, 1)).view(-1).tolist()
        last = logits[-1].clone()
        for t, b in bias.items():
            last[t] += b
        seq.append(int(last.argmax()))
        lps.append(float(torch.log_softmax(logits[-1], -1)[seq[-1]]))
    return seq[len(prompt):], lps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(dst, world: int, extra: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    cmd = [sys.executable, "-m", "quantkit", "serve", str(dst), "--device", "cpu", "--dtype", "float32", "--no-act-quant",
           "--port", "0", "--kv-cache-gib", "0.01", "--max-model-len", "128", "--max-num-batched-tokens", "8", *extra]
    return [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stderr=subprocess.PIPE, text=True)
            for r in range(world)]


def post(url: str, body: dict) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode()), timeout=120) as r:
        return json.loads(r.read())


def check_choices(got: dict, whole, text, bias: dict[int, float]) -> list[list[int]]:
    """Every choice (n = 2 per prompt, echoed, with logprobs) against the judge; the judge's tokens."""
    want = []
    for i, p in enumerate(PROMPTS):
        out, lps = judge(whole, p, bias)
        want.append(out)
        for c in got["choices"][2 * i: 2 * i + 2]:
            lp = c["logprobs"]
            assert lp["tokens"] == [text.token_str(t) for t in p + out], (i, c)
            assert lp["token_logprobs"][0] is None
            assert lp["token_logprobs"][1:] == pytest.approx(lps[1:], abs=1e-4), i
    return want


CASES = [("qwen3-moe", 2, 1), ("gpt-oss", 2, 1), ("deepseek-v3", 2, 1),  # expert parallel
         ("qwen3-moe", 2, 2), ("gpt-oss", 4, 2), ("deepseek-v3", 2, 2),  # + tensor parallel (gpt-oss: 2 DP groups of TP 2)
         ("qwen3", 2, 2)]  # tensor parallel alone (a dense model)


@pytest.mark.parametrize("family,ep,tp", CASES, ids=[f"{f}-ep{e}-tp{t}" for f, e, t in CASES])
def test_sharded_serving_equals_the_whole_model(ckpt, model, tmp_path, family, ep, tp):
    """Prompts over the whole vocabulary, n = 2, echo with logprobs, and logit_bias: the same tokens and
    logprobs as the whole model's cache-less forwards."""
    src, whole = ckpt(family), model(family)
    if family == "deepseek-v3" and tp > 1:  # its tiny FP8 tiles (128 rows) cannot be cut in two: a bf16 conversion can
        from quantkit.converters import ConvertOptions, convert
        from quantkit.engine import load

        convert(src, tmp_path / "bf16", ConvertOptions(to="bf16"))
        src = tmp_path / "bf16"
        whole = load(src, dtype=torch.float32, act_quant=False)  # the judge: that conversion, whole
    dst = tmp_path / "ep2"
    shard(src, dst, ep=ep, tp=tp)
    procs = launch(dst, ep)
    try:
        line = procs[0].stderr.readline()
        m = re.search(r"serving ep2 on (http://\S+) ", line)
        assert m, line + procs[0].stderr.read()
        url, text = m.group(1), ModelText(src, whole.config)
        body = {"prompt": PROMPTS, "max_tokens": N, "temperature": 0, "ignore_eos": True, "n": 2, "echo": True, "logprobs": 1}
        plain = check_choices(post(url + "/v1/completions", body), whole, text, {})
        biased = check_choices(post(url + "/v1/completions", {**body, "logit_bias": {str(t): b for t, b in BIAS.items()}}),
                               whole, text, BIAS)
        assert biased != plain  # the bias changed some token: the check above saw it applied
        assert post(url + "/detokenize", {"tokens": [1900, 2047]})["prompt"] == text.decode([1900, 2047], skip_special_tokens=False)
        if tp == 1:  # SIGTERM to rank 0 (a service manager) ...
            procs[0].send_signal(signal.SIGTERM)
        else:  # ... or Ctrl-C, which reaches every rank
            for p in procs:
                p.send_signal(signal.SIGINT)
        assert [p.wait(timeout=60) for p in procs] == [0] * ep
        assert not any("Traceback" in p.stderr.read() for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.stderr.close()


def test_a_sharded_checkpoint_needs_one_process_per_rank(ckpt, tmp_path):
    from click.testing import CliRunner

    from quantkit.cli import main

    shard(ckpt("qwen3-moe"), tmp_path / "ep2", ep=2)
    r = CliRunner().invoke(main, ["serve", str(tmp_path / "ep2"), "--device", "cpu"], env={"WORLD_SIZE": None})
    assert r.exit_code == 1 and "torchrun --nproc-per-node 2 -m quantkit serve" in r.output
