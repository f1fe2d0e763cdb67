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
