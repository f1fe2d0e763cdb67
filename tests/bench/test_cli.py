"""``quantkit bench``: lists the benchmarks without importing them, passes a benchmark its own options and exit status."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from quantkit.bench import BENCHMARKS
from quantkit.cli import main


def test_listing_imports_no_benchmark_and_no_torch():
    code = ("import sys; from quantkit.cli import main; main(['bench', '--help'], standalone_mode=False); "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'quantkit.bench.'))))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]"), out[-500:]
    for name in BENCHMARKS:
        assert f"  {name} " in out, name


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_parses_its_own_options(name):
    r = CliRunner().invoke(main, ["bench", name, "--help"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"usage: quantkit bench {name} "), r.output[:200]


def test_arguments_and_exit_status_pass_through(monkeypatch):
    seen = []

    def fake(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    monkeypatch.setattr(importlib.import_module("quantkit.bench.source_hash"), "main", fake)
    r = CliRunner().invoke(main, ["bench", "hash", "--file", "x", "--help-me", "-v"])
    assert r.exit_code == 3 and seen == [["--file", "x", "--help-me", "-v"]]


def test_unknown_benchmark_and_bad_options_fail():
    r = CliRunner().invoke(main, ["bench", "nope"])
    assert r.exit_code != 0 and "No such command 'nope'" in r.output
    r = CliRunner().invoke(main, ["bench", "kernels", "--device", "cpu"])  # --out is required
    assert r.exit_code == 2 and "the following arguments are required: --out" in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_a_cuda_run_without_cuda_is_refused(tmp_path):
    r = CliRunner().invoke(main, ["bench", "mla", "--out", str(tmp_path)])
    assert r.exit_code == 1 and "no CUDA device; use --device cpu" in r.output
    r = CliRunner().invoke(main, ["bench", "profile-moe"])
    assert r.exit_code == 1 and "no CUDA device here" in r.output
