#!/usr/bin/env python
"""Check docs/performance.md against the result rows it is written from (docs/results/*.jsonl).

    python scripts/check_performance.py [--doc docs/performance.md] [--results docs/results]

Verification, not rendering: the tables stay hand-laid (units, merged cells, ratios written as the
measurement recorded them), and this script proves every number in them comes from a result row.

- Every table in the doc is introduced by a marker on the line above its header,
  ``<!-- rows: AREA TABLE -->``: the rows of docs/results/AREA.jsonl whose ``table`` is TABLE
  (AREA ``*``: that table's rows from every file, as the summary of goals draws one row from each area).
- Every body line of a table must be covered by one of those rows: each number in the line
  (``\\d+(\\.\\d+)?``, so ``1.01-1.03x`` is 1.01 and 1.03) equals one of the row's values, where a numeric
  value v matches a token of d decimals when ``f"{v:.{d}f}"`` (or, for shares stored as fractions,
  ``f"{100 * v:.{d}f}"``) is the token, and a text value matches the numbers written in it. The row's
  provenance (device, versions, command, date, source) is not matched against.
- Every row of a marked (AREA, TABLE) must cover at least one line, so a row cannot go unshown.
- Every row carries device, versions, command, date and source, and its command (as run today, below) appears
  verbatim in the doc.

Two kinds of row are read.  The flat rows written by hand from the measurement notebook: ``table``, the values,
and the provenance keys above.  And the records ``quantkit bench`` writes (``"schema": "quantkit.bench/1"``, see
quantkit/bench/record.py) with a ``table`` and a ``source`` added: their values are the record's parameters and
metrics, the device and versions its environment.  A row recorded before the benchmarks moved into
``quantkit bench`` names the script it ran, ``python scripts/{bench_,}NAME.py ARGS``; the same run is
``quantkit bench NAME ARGS`` now (underscores in NAME become dashes), and that is the form the doc must show.

Exits 1 with one line per problem (doc line number and text); prints a count of checked lines on success.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!--\s*rows:\s*(\S+)\s+(\S+)\s*-->")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
PROVENANCE = ("device", "versions", "command", "date", "source")
SCHEMA = "quantkit.bench/1"
SCRIPT = re.compile(r"python scripts/(?:bench_)?(\w+)\.py")  # a benchmark's command before `quantkit bench`


def current_command(command: str) -> str:
    """A recorded command as it is run today (the script bench_fused_quant.py -> ``quantkit bench fused-quant``)."""
    return SCRIPT.sub(lambda m: "quantkit bench " + m.group(1).replace("_", "-"), command)


def doc_row(row: dict) -> dict:
    """A row as the check reads it: a flat row as it is, a ``quantkit bench`` record flattened (values = its
    parameters and metrics; device and versions from its environment)."""
    if row.get("schema") != SCHEMA:
        return row
    env = row.get("env", {})
    versions = ", ".join(f"{k} {v}" for k, v in env.items() if k != "device")
    return {"table": row.get("table"), **row.get("params", {}), **row.get("metrics", {}), "device": env.get("device"),
            "versions": versions, "command": row.get("command"), "date": row.get("date"), "source": row.get("source")}


def load_rows(results: Path) -> dict[tuple[str, str], list[dict]]:
    """(area, table) -> rows, from every AREA.jsonl under results."""
    tables: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(results.glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                row = doc_row(json.loads(line))
                row["_where"] = f"{path.name}:{n}"
                tables.setdefault((path.stem, row["table"]), []).append(row)
    return tables


def matches(token: str, value: object) -> bool:
    """Whether a number written in the doc is this value as recorded."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        d = len(token.split(".")[1]) if "." in token else 0
        return token in (f"{value:.{d}f}", f"{100 * value:.{d}f}")
    if isinstance(value, str):
        return token in NUMBER.findall(value)
    if isinstance(value, list):
        return any(matches(token, v) for v in value)
    return False


def covers(row: dict, tokens: list[str]) -> bool:
    values = [v for k, v in row.items() if k not in PROVENANCE and k not in ("table", "_where")]
    return all(any(matches(t, v) for v in values) for t in tokens)


def doc_tables(lines: list[str]) -> list[tuple[int, str | None, list[tuple[int, str]]]]:
    """(line number of the header, marker text or None, body lines) for every markdown table."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            marker = lines[i - 1].strip() if i else None
            body, j = [], i + 2  # skip the header and the |---| line
            while j < len(lines) and lines[j].startswith("|"):
                body.append((j + 1, lines[j]))
                j += 1
            out.append((i + 1, marker, body))
            i = j
        else:
            i += 1
    return out


def check(doc: Path, results: Path) -> tuple[list[str], int]:
    text = doc.read_text()
    lines = text.splitlines()
    tables = load_rows(results)
    problems, checked, shown = [], 0, set()
    for (area, table), rows in tables.items():
        for row in rows:
            missing = [k for k in PROVENANCE if not row.get(k)]
            if missing:
                problems.append(f"{row['_where']}: no {', '.join(missing)}")
            elif current_command(row["command"]) not in text:
                problems.append(f"{row['_where']}: its command is not in {doc.name}: {current_command(row['command'])}")
    for header, marker, body in doc_tables(lines):
        m = MARKER.fullmatch(marker or "")
        if not m:
            problems.append(f"{doc.name}:{header}: a table without a '<!-- rows: AREA TABLE -->' line above it")
            continue
        area, table = m.group(1), m.group(2)
        keys = [k for k in tables if k[1] == table and area in ("*", k[0])]
        rows = [row for k in keys for row in tables[k]]
        if not rows:
            problems.append(f"{doc.name}:{header}: no rows for {area}.jsonl table {table!r}")
            continue
        shown.update(keys)
        used: set[int] = set()
        for n, line in body:
            tokens = NUMBER.findall(line)
            hits = [i for i, row in enumerate(rows) if covers(row, tokens)]
            if not hits:
                problems.append(f"{doc.name}:{n}: no row of {area}.jsonl {table!r} holds all of {tokens}: {line}")
            used.update(hits)
            checked += 1
        problems += [f"{rows[i]['_where']}: shown by no line of the table at {doc.name}:{header}"
                     for i in range(len(rows)) if i not in used]
    problems += [f"{area}.jsonl table {table!r}: no table of {doc.name} shows it"
                 for area, table in tables if (area, table) not in shown]
    return problems, checked


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "performance.md")
    p.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    a = p.parse_args()
    problems, checked = check(a.doc, a.results)
    for line in problems:
        print(line)
    if problems:
        sys.exit(1)
    print(f"{a.doc.name}: {checked} table lines, every number found in {a.results.name}/*.jsonl")


if __name__ == "__main__":
    main()
