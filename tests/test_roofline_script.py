"""scripts/roofline.py: benchmark rows in, a roofline PNG out; bad input is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "roofline.py"
ROWS = [  # bench_common.Row fields the script reads; rates from a memory-bound and a compute-bound case
    {"family": "gemm", "case": "a", "m": 1, "n": 64, "k": 64, "backend": "triton", "tflops": 2.0, "gbs": 2000.0, "check": "ok"},
    {"family": "moe", "case": "b", "m": 8192, "n": 64, "k": 64, "backend": "triton", "tflops": 500.0, "gbs": 1000.0, "check": "ok"},
    {"family": "gemm", "case": "a", "m": 1, "n": 64, "k": 64, "backend": "triton+bias", "tflops": None, "gbs": None, "check": "ok", "note": "check only"},
]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_plots_the_rows_with_rates(tmp_path):
    res = tmp_path / "results.jsonl"
    res.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    out = tmp_path / "plots" / "roof.png"
    proc = run(str(res), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "2 points in 2 series" in proc.stdout, proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refuses_missing_files_bad_rows_and_rate_free_input(tmp_path):
    proc = run(str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x.png"))
    assert proc.returncode != 0 and "no such results file" in proc.stderr and "nope.jsonl" in proc.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    proc = run(str(bad), "--out", str(tmp_path / "x.png"))
    assert proc.returncode != 0 and f"{bad}:2" in proc.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps(ROWS[2]) + "\n")
    proc = run(str(empty), "--out", str(tmp_path / "x.png"))
    assert proc.returncode != 0 and "no row with a rate" in proc.stderr
    assert not (tmp_path / "x.png").exists(), "no partial output on refused input"
