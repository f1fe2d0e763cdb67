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
