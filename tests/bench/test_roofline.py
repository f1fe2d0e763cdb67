"""``quantkit bench roofline``: benchmark records (and the flat rows written before them) in, a roofline PNG out;
bad input is refused by name."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from quantkit.bench.harness import ROW_PARAMS
from quantkit.bench.record import Run
from quantkit.cli import main

ROWS = [  # harness.Row fields the plot reads; rates from a memory-bound and a compute-bound case
    {"family": "gemm", "case": "a", "m": 1, "n": 64, "k": 64, "backend": "triton", "tflops": 2.0, "gbs": 2000.0, "check": "ok"},
    {"family": "moe", "case": "b", "m": 8192, "n": 64, "k": 64, "backend": "triton", "tflops": 500.0, "gbs": 1000.0, "check": "ok"},
    {"family": "gemm", "case": "a", "m": 1, "n": 64, "k": 64, "backend": "triton+bias", "tflops": None, "gbs": None, "check": "ok", "note": "check only"},
]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["bench", "roofline", *args])


def test_plots_the_rows_with_rates(tmp_path):
    """A record file and a file of flat rows: the same points either way."""
    res = tmp_path / "results.jsonl"
    rec = Run("kernels", "quantkit bench kernels --out x", {"device": "cpu"}, "2026-12-01T00:00:00Z")
    for r in ROWS:
        rec.write(res, {k: r.get(k) for k in (*ROW_PARAMS, "tflops", "gbs", "check")}, ROW_PARAMS)
    flat = tmp_path / "flat.jsonl"
    flat.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    for src in (res, flat):
        out = tmp_path / "plots" / f"{src.stem}.png"
        r = run(str(src), "--out", str(out))
        assert r.exit_code == 0, r.output
        assert "2 points in 2 series" in r.output, r.output
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refuses_missing_files_bad_rows_and_rate_free_input(tmp_path):
    r = run(str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x.png"))
    assert r.exit_code != 0 and "no such results file" in r.output and "nope.jsonl" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    r = run(str(bad), "--out", str(tmp_path / "x.png"))
    assert r.exit_code != 0 and f"{bad}:2" in r.output
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"schema": "quantkit.bench/1", "bench": "kernels"}) + "\n")
    r = run(str(broken), "--out", str(tmp_path / "x.png"))
    assert r.exit_code != 0 and f"{broken}:1: not a valid record" in r.output and "missing params" in r.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps(ROWS[2]) + "\n")
    r = run(str(empty), "--out", str(tmp_path / "x.png"))
    assert r.exit_code != 0 and "no row with a rate" in r.output
    assert not (tmp_path / "x.png").exists(), "no partial output on refused input"
