"""Shared by the benchmark tests: ``quantkit bench NAME ARGS`` run, and its records read back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from quantkit.bench.record import is_record, read
from quantkit.cli import main


def bench(*args: str) -> str:
    """Run ``quantkit bench ARGS``; its output.  In this process when Triton's interpreter is on (the CPU suite:
    tests/conftest.py turns it on before anything imports Triton); else (a CUDA machine, where Triton has chosen
    compiled kernels in this process) in a fresh interpreter with it on, as ``--device cpu`` asks."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        r = CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)
        assert r.exit_code == 0, r.output[-3000:]
        return r.output
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "quantkit", "bench", *args], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout + p.stderr


def records(path: Path, name: str) -> list[dict]:
    """The records a run of benchmark ``name`` wrote to ``path``: at least one, each valid (``read`` checks every
    line), each naming the benchmark and its command line, with the environment record."""
    rows = read(path)
    assert rows, f"{path} holds no record"
    for r in rows:
        assert is_record(r) and r["bench"] == name and r["command"].startswith(f"quantkit bench {name} "), r
        assert {"device", "python", "torch", "triton", "quantkit", "git"} <= set(r["env"]), r["env"]
    return rows
