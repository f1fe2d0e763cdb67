"""The load and abuse suite (scripts/load_serve.py) at CI size: the server in one process, the load
generator in another, 48 clients at once mixing whole responses, streams, n = 2 and streams dropped
mid-way, then probes beside 20 slowloris connections.  Asserted: every request answered correctly
or refused (429 / 503), no reset, nothing running or cached at the end, the server exiting 0;
latency is reported, not judged (a shared CI machine's timing is not the server's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "load_serve.py"


def test_load_and_abuse_at_ci_size(ckpt):
    r = subprocess.run([sys.executable, str(SCRIPT), "--ckpt", str(ckpt("qwen3")), "--clients", "48", "--slowloris", "20",
                        "--probe-clients", "4", "--probe-requests", "6", "--no-latency-check", "--deadline", "300"],
                       capture_output=True, text=True, timeout=400)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and all(out["checks"].values()), (out["checks"], out["failures"], r.stderr[-2000:])
    assert out["answered"] + out["refused"] == out["requests"] == 96 and out["answered"] >= 48
    assert out["slowloris_cuts"] > 0  # the header deadline cut the slow connections
    assert out["end_metrics"]["generation_tokens_total"] > 0


def test_bench_http_reports_each_level_and_mode(ckpt, tmp_path):
    """scripts/bench_http.py (the HTTP benchmark, load generator in its own process) on a tiny server: a row per
    concurrency and mode whose token counts the script checked, stream latencies, the plot."""
    from quantkit.serve.launch import build

    s = build(str(ckpt("qwen3")), port=0, dtype="float32", act_quant=False, max_model_len=128, kv_cache_gib=0.01)
    s.start_background()
    try:
        r = subprocess.run([sys.executable, str(SCRIPT.parent / "bench_http.py"), "--url", s.url, "--out", str(tmp_path),
                            "--concurrency", "1,3", "--prompt-len", "8", "--gen", "4", "--rounds", "1", "--vocab", "500"],
                           capture_output=True, text=True, timeout=300)
    finally:
        s.close()
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(x["concurrency"], x["mode"]) for x in rows] == [(1, "stream"), (1, "whole"), (3, "stream"), (3, "whole")]
    assert all(x["http_tok_s"] > 0 for x in rows) and all(0 < x["ttft_p50_ms"] <= x["ttft_p99_ms"] for x in rows[::2])
    assert (tmp_path / "http.png").stat().st_size > 0
