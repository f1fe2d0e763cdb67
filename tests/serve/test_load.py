"""The load and abuse suite (scripts/load_serve.py) at CI size: the server in one process, the load
generator in another, 48 clients at once mixing whole responses, streams, n = 2 and streams dropped
mid-way, 8 clients whose request comes after the header deadline, then probes beside 20 slowloris
connections.  Asserted: every request answered correctly or refused (429 / 503), every late one
answered 408, no connection refused, reset or closed without an answer, nothing running or cached
at the end, the server exiting 0; latency is reported, not judged (a shared CI machine's timing is
not the server's).  The default size (512 clients, 300 slowloris) runs with ``-m slow``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "load_serve.py"


def load(ckpt, *args: str, timeout: float) -> dict:
    r = subprocess.run([sys.executable, str(SCRIPT), "--ckpt", str(ckpt("qwen3")), "--no-latency-check", *args],
                       capture_output=True, text=True, timeout=timeout)
    assert r.stdout, r.stderr[-3000:]  # the script counts broken connections; it must not crash on one
    out = json.loads(r.stdout)
    assert r.returncode == 0 and all(out["checks"].values()), (out["checks"], out["connections_broken"], out["failures"],
                                                               r.stderr[-2000:])
    assert out["connections_broken"] == {} and out["late_answered"] == out["late_clients"]
    assert out["answered"] + out["refused"] == out["requests"] and out["answered"] >= out["clients"]
    assert out["slowloris_cuts"] > 0  # the header deadline cut the slow connections
    assert out["end_metrics"]["generation_tokens_total"] > 0
    return out


def test_load_and_abuse_at_ci_size(ckpt):
    """Fails without the 408 at the header deadline: the late clients found their connections closed."""
    out = load(ckpt, "--clients", "48", "--late-clients", "8", "--slowloris", "20", "--probe-clients", "4",
               "--probe-requests", "6", "--deadline", "300", timeout=400)
    assert out["requests"] == 96 and out["late_answered"] == 8


@pytest.mark.slow
def test_load_and_abuse_at_full_size(ckpt):
    out = load(ckpt, "--deadline", "900", timeout=1000)
    assert out["requests"] == 1024 and out["late_answered"] == 16


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
