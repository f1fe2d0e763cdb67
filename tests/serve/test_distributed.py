"""Serving ``quantkit shard`` outputs, expert and tensor parallel: one process per rank (gloo on the
CPU, as torchrun launches them), rank 0 serving HTTP.  The judge is the unsharded checkpoint: greedy tokens
equal a cache-less forward of the whole model in this process, for a per-expert family (Qwen3-MoE),
GPT-OSS's fused experts, and DeepSeek-V3 (shared expert, a dense first layer; its MTP layer is loaded from its shard)."""

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

from quantkit.serve.text import ModelText
from quantkit.shard import shard

from .test_scheduler import recompute

PROMPTS = [[5, 6, 7, 8], [900, 12], [33] * 9]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(dst, world: int) -> list[subprocess.Popen]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    cmd = [sys.executable, "-m", "quantkit", "serve", str(dst), "--device", "cpu", "--dtype", "float32", "--no-act-quant",
           "--port", "0", "--kv-cache-gib", "0.01", "--max-model-len", "128", "--max-num-batched-tokens", "8"]
    return [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stderr=subprocess.PIPE, text=True)
            for r in range(world)]


CASES = [("qwen3-moe", 2, 1), ("gpt-oss", 2, 1), ("deepseek-v3", 2, 1),  # expert parallel
         ("qwen3-moe", 2, 2), ("gpt-oss", 4, 2), ("deepseek-v3", 2, 2)]  # + tensor parallel (gpt-oss: 2 DP replicas of TP 2)


@pytest.mark.parametrize("family,ep,tp", CASES, ids=[f"{f}-ep{e}-tp{t}" for f, e, t in CASES])
def test_sharded_serving_equals_the_whole_model(ckpt, model, tmp_path, family, ep, tp):
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
        body = {"prompt": PROMPTS, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        with urllib.request.urlopen(urllib.request.Request(m.group(1) + "/v1/completions", json.dumps(body).encode()), timeout=120) as r:
            got = [c["text"] for c in json.loads(r.read())["choices"]]
        text = ModelText(src, whole.config)
        assert got == [text.decode(recompute(whole, p, 6)) for p in PROMPTS]
        procs[0].send_signal(signal.SIGTERM)
        assert [p.wait(timeout=60) for p in procs] == [0] * ep
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
