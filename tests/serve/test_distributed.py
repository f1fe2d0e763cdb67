"""Expert-parallel serving of ``quantkit shard --ep 2`` outputs: two processes (gloo on the CPU, as
torchrun launches them), rank 0 serving HTTP.  The judge is the unsharded checkpoint: greedy tokens
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

from quantkit.engine.text import ModelText
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


@pytest.mark.parametrize("family", ["qwen3-moe", "gpt-oss", "deepseek-v3"])
def test_expert_parallel_serving_equals_the_whole_model(ckpt, model, tmp_path, family):
    dst = tmp_path / "ep2"
    shard(ckpt(family), dst, ep=2)
    procs = launch(dst, 2)
    try:
        line = procs[0].stderr.readline()
        m = re.search(r"serving ep2 on (http://\S+) ", line)
        assert m, line + procs[0].stderr.read()
        body = {"prompt": PROMPTS, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        with urllib.request.urlopen(urllib.request.Request(m.group(1) + "/v1/completions", json.dumps(body).encode()), timeout=120) as r:
            got = [c["text"] for c in json.loads(r.read())["choices"]]
        text = ModelText(ckpt(family), model(family).config)
        assert got == [text.decode(recompute(model(family), p, 6)) for p in PROMPTS]
        procs[0].send_signal(signal.SIGTERM)
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
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


def test_tensor_parallel_shards_are_refused(ckpt, tmp_path):
    from click.testing import CliRunner

    from quantkit.cli import main

    shard(ckpt("qwen3-moe"), tmp_path / "tp2", ep=2, tp=2)
    r = CliRunner().invoke(main, ["serve", str(tmp_path / "tp2"), "--device", "cpu"], env={"WORLD_SIZE": "2", "RANK": "0"})
    assert r.exit_code == 1 and "expert parallel only (shard with --tp 1)" in r.output
