"""``quantkit bench sharded-gap`` on the CPU: a bf16 EP 2 x TP 2 shard of an mxfp8 conversion (activations quantized,
as served by default) against the unsharded model, teacher-forced.  Each expert's weighted share and each
rank's partial product stay float32 until their sum, as in the unsharded model: rounded to bf16 first
they moved the log-probabilities by 0.13 on average (1.3 at most) on this model; what is left may only
be float32 summation order (docs/serve.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from .benchrun import records


def test_sharded_bf16_logprobs_match_the_unsharded_model(tmp_path):
    """In a process of its own: the run sets torch's thread count and spawns its ranks."""
    proc = subprocess.run([sys.executable, "-m", "quantkit", "bench", "sharded-gap", "--family", "qwen3-moe", "--to", "mxfp8", "--ep", "2",
                           "--tp", "2", "--seqs", "2", "--len", "32", "--json", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(rows) == {"sharded", "reversed", "float32"}
    assert {r["params"]["run"]: r["metrics"] for r in records(tmp_path / "results.jsonl", "sharded-gap")} == rows
    assert rows["sharded"]["mean_dlogprob"] < 0.01 and rows["sharded"]["max_dlogprob"] < 0.5, rows["sharded"]
    assert rows["float32"]["mean_dlogprob"] > 0.01  # the comparison sees differences of the size the bug made
