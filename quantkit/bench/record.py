"""The one result record of the benchmarks: a JSON line per measurement.

    {"schema": "quantkit.bench/1", "bench": "kernels", "date": "2026-12-01T17:13:53Z",
     "command": "quantkit bench kernels --out OUT --ms 1 16", "env": {...}, "params": {...}, "metrics": {...}}

``bench`` is the ``quantkit bench`` name, ``command`` the command line that ran (it reruns the measurement),
``env`` :func:`.env.environment`, ``params`` what identifies the measurement within the run (case, shape,
backend, concurrency ...) and ``metrics`` what was measured (times, rates, checks, notes).  A record copied
into docs/results/ for docs/performance.md gets two more keys, ``table`` (the doc table that shows it) and
``source`` (where the run is discussed); scripts/check_performance.py reads it there.  A :class:`Run` is
created once per run and writes every record of it.  :func:`read` takes these records and also the flat
rows written before the records existed (one dict of parameters and metrics per line); :func:`flat` gives
either as one dict, which is what readers of results (roofline, the HTTP benchmark's engine figures) use.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SCHEMA = "quantkit.bench/1"
KEYS = ("schema", "bench", "date", "command", "env", "params", "metrics")
DOC_KEYS = ("table", "source")  # optional: a record shown in docs/performance.md


def command(module: str, argv: list[str]) -> str:
    """The command line of a benchmark module run with ``argv``."""
    from . import prog

    return " ".join([prog(module), shlex.join(argv)]).strip()


@dataclass(frozen=True)
class Run:
    """What every record of one run shares."""

    bench: str
    command: str
    env: dict[str, str]
    date: str

    @classmethod
    def start(cls, module: str, argv: list[str], env: dict[str, str]) -> Run:
        from . import command_name

        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(command_name(module), command(module, argv), env, now)

    def record(self, params: dict, metrics: dict) -> dict:
        return {"schema": SCHEMA, "bench": self.bench, "date": self.date, "command": self.command, "env": self.env,
                "params": params, "metrics": metrics}  # fmt: skip

    def write(self, path: Path, row: object, params: Iterable[str]) -> dict:
        """Append one record to ``path``: ``row`` (a dict or a dataclass) split into the keys named in ``params``
        and the metrics (every other key)."""
        row = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
        keys = tuple(params)
        missing = [k for k in keys if k not in row]
        if missing:
            raise KeyError(f"record parameters {missing} are not in the row {sorted(row)}")
        rec = self.record({k: row[k] for k in keys}, {k: v for k, v in row.items() if k not in keys})
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return rec


def problems(rec: object) -> list[str]:
    """Why ``rec`` is not a valid record (empty when it is)."""
    if not isinstance(rec, dict):
        return [f"not a JSON object: {type(rec).__name__}"]
    out = [f"missing {k}" for k in KEYS if k not in rec]
    out += [f"unknown key {k}" for k in rec if k not in KEYS + DOC_KEYS]
    if rec.get("schema", SCHEMA) != SCHEMA:
        out.append(f"schema {rec['schema']!r}, not {SCHEMA!r}")
    out += [f"{k} is not a non-empty string" for k in ("bench", "date", "command", *DOC_KEYS) if k in rec and not (isinstance(rec[k], str) and rec[k])]
    out += [f"{k} is not an object" for k in ("env", "params", "metrics") if k in rec and not isinstance(rec[k], dict)]
    if isinstance(rec.get("env"), dict) and not all(isinstance(v, str) for v in rec["env"].values()):
        out.append("env holds a value that is not a string")
    if isinstance(rec.get("params"), dict) and isinstance(rec.get("metrics"), dict):
        out += [f"{k} is both a parameter and a metric" for k in rec["params"] if k in rec["metrics"]]
    return out


def is_record(row: dict) -> bool:
    return "schema" in row


def flat(row: dict) -> dict:
    """A record's parameters and metrics as one dict; a flat row (written before the records) as it is."""
    return {**row["params"], **row["metrics"]} if is_record(row) else row


def read(path: Path) -> list[dict]:
    """The records and flat rows of a JSON-lines file (blank lines skipped); a line that is neither, or a record
    that is not valid, is refused with its file and line."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not a JSON row ({err.msg})") from err
        bad = problems(row) if isinstance(row, dict) and is_record(row) else [] if isinstance(row, dict) else ["not a JSON object"]
        if bad:
            raise ValueError(f"{path}:{n}: not a valid record: {'; '.join(bad)}")
        out.append(row)
    return out
