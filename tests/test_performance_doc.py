"""docs/performance.md against docs/results/*.jsonl (scripts/check_performance.py), and the check's own failures."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_performance", ROOT / "scripts" / "check_performance.py")
check_performance = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_performance)
DOC, RESULTS = ROOT / "docs" / "performance.md", ROOT / "docs" / "results"


def test_every_table_number_is_a_result_row():
    problems, checked = check_performance.check(DOC, RESULTS)
    assert not problems, "\n".join(problems)
    assert checked >= 100


def test_a_changed_number_fails(tmp_path):
    doc = tmp_path / "performance.md"
    doc.write_text(DOC.read_text().replace("| 1 | lookahead | 389 | 2.30 |", "| 1 | lookahead | 389 | 2.31 |"))
    problems, _ = check_performance.check(doc, RESULTS)
    assert len(problems) == 2 and "2.31" in problems[0], problems  # the line, and the row no line shows


def test_a_table_without_rows_fails(tmp_path):
    doc = tmp_path / "performance.md"
    doc.write_text(DOC.read_text() + "\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    problems, _ = check_performance.check(doc, RESULTS)
    assert problems == [f"performance.md:{len(doc.read_text().splitlines()) - 2}: a table without a "
                        "'<!-- rows: AREA TABLE -->' line above it"]


def test_a_row_without_provenance_or_shown_nowhere_fails(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    row = {"table": "ep16", "model": "x", "seconds": 1.0, "device": "d", "versions": "v", "command": "c", "date": "",
           "source": "s"}
    with open(results / "shard.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    problems, _ = check_performance.check(DOC, results)
    assert any("no date" in p for p in problems) and any("shown by no line" in p for p in problems), problems


def _shard_record(**change) -> dict:
    """The first ep16 row of shard.jsonl as a ``quantkit bench shard`` record copied into docs/results."""
    row = json.loads((RESULTS / "shard.jsonl").read_text().splitlines()[0])
    values = {k: v for k, v in row.items() if k not in ("table", "device", "versions", "command", "date", "source")}
    rec = {"schema": "quantkit.bench/1", "bench": "shard", "date": "2026-12-02T10:00:00Z",
           "command": "quantkit bench shard --work /tmp/bench --workers 2", "env": {"device": row["device"], "python": "3.11.7"},
           "params": {"model": values.pop("model")}, "metrics": values, "table": "ep16", "source": "a later run"}
    return {**rec, **change}


def test_a_bench_record_is_read_as_a_row(tmp_path):
    """A record of ``quantkit bench`` with a table and a source is checked like a flat row: its parameters and
    metrics are the values, its environment the provenance."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    with open(results / "shard.jsonl", "a") as f:
        f.write(json.dumps(_shard_record()) + "\n")
    problems, _ = check_performance.check(DOC, results)
    assert problems == [], problems
    with open(results / "shard.jsonl", "a") as f:
        bad = _shard_record(source="")
        bad["metrics"] = {**bad["metrics"], "seconds": 71.4}
        f.write(json.dumps(bad) + "\n")
    problems, _ = check_performance.check(DOC, results)
    assert len(problems) == 2 and problems[0].endswith("shard.jsonl:5: no source"), problems
    assert problems[1].startswith("shard.jsonl:5: shown by no line of the table"), problems  # 71.4 s is in no line


def test_a_recorded_script_command_is_shown_as_quantkit_bench(tmp_path):
    old, new = "python scripts/bench_shard.py --work /tmp/bench --workers 2", "quantkit bench shard --work /tmp/bench --workers 2"
    assert check_performance.current_command("OMP_NUM_THREADS=1 " + old) == "OMP_NUM_THREADS=1 " + new
    assert check_performance.current_command("python scripts/http_ceiling.py --out OUT") == "quantkit bench http-ceiling --out OUT"
    doc = tmp_path / "performance.md"
    doc.write_text(DOC.read_text().replace(new, old))
    problems, _ = check_performance.check(doc, RESULTS)
    assert problems and all(p.endswith(f"its command is not in performance.md: {new}") for p in problems), problems
