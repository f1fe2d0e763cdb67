"""The load and abuse suite (``quantkit bench load-serve``) at CI size: the server in one process, the load
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

import pytest

from quantkit.bench.record import read

LOAD = [sys.executable, "-m", "quantkit", "bench", "load-serve"]


def load(ckpt, *args: str, timeout: float) -> dict:
    r = subprocess.run([*LOAD, "--ckpt", str(ckpt("qwen3")), "--no-latency-check", *args],
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


def test_load_and_abuse_at_ci_size(ckpt, tmp_path):
    """Fails without the 408 at the header deadline: the late clients found their connections closed."""
    out = load(ckpt, "--clients", "48", "--late-clients", "8", "--slowloris", "20", "--probe-clients", "4",
               "--probe-requests", "6", "--deadline", "300", "--out", str(tmp_path), timeout=400)
    assert out["requests"] == 96 and out["late_answered"] == 8
    (rec,) = read(tmp_path / "results.jsonl")  # the summary as a benchmark record
    assert rec["bench"] == "load-serve" and rec["params"] == {"device": "cpu", "dtype": "float32", "clients": 48}
    assert rec["metrics"]["answered"] == out["answered"] and rec["metrics"]["checks"] == out["checks"]


@pytest.mark.slow
def test_load_and_abuse_at_full_size(ckpt):
    out = load(ckpt, "--deadline", "900", timeout=1000)
    assert out["requests"] == 1024 and out["late_answered"] == 16
