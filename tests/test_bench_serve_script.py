"""scripts/bench_serve.py runs end to end on the CPU (tiny preset): engine, raw forward and HTTP rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_serve.py"


def test_smoke_run_and_the_hbm_floor(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--family", "qwen3-moe",
                           "--concurrency", "1,3", "--prompt-len", "8", "--gen", "3"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["engine_tok_s"] > 0 and r["http_tok_s"] > 0 and r["raw_step_ms"] > 0 and r["hbm_floor_ms"] > 0
    assert "| C | engine tok/s | http tok/s |" in proc.stdout


def test_step_bytes_counts_the_experts_a_batch_can_touch(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_serve

    from quantkit.engine import load
    from quantkit.engine.layers.moe import MoE
    from quantkit.synth import synthesize

    synthesize("qwen3-moe", tmp_path / "m", preset="tiny")
    m = load(tmp_path / "m", dtype=torch.bfloat16)
    moes = [x for x in m.modules() if isinstance(x, MoE)]
    e, k = moes[0].experts.num_experts, moes[0].router.routing.top_k
    expert_bytes = sum(t.numel() * t.element_size() for x in moes for t in list(x.experts.buffers()))
    kv_token = sum(int(torch.Size(s).numel()) for spec in m.cache_specs() for s in spec.values()) * 2
    # one sequence touches k of E experts; a huge batch touches them all
    one, many = bench_serve.step_bytes(m, 1, 0), bench_serve.step_bytes(m, 10_000, 0)
    row = m.embed_tokens.shape[1] * 2
    assert abs(many - one - (expert_bytes * (1 - k / e) + (10_000 - 1) * row)) <= 2 * len(moes)  # int() per layer
    assert bench_serve.step_bytes(m, 1, 100) - one == 100 * kv_token
