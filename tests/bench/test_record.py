"""quantkit.bench.record: the one result record, written, validated and read back (with the flat rows of before)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from quantkit.bench import BENCHMARKS, command_name, prog
from quantkit.bench.record import SCHEMA, Run, command, flat, problems, read

RUN = Run("fused-quant", "quantkit bench fused-quant --out x", {"device": "cpu", "torch": "2.13"}, "2026-12-01T00:00:00Z")


@dataclass
class Row:
    case: str
    m: int
    ms: float | None
    check: str


def test_a_row_is_split_into_parameters_and_metrics(tmp_path):
    path = tmp_path / "r.jsonl"
    a = RUN.write(path, Row("rmsnorm", 16, 0.25, "ok"), ("case", "m"))
    b = RUN.write(path, {"case": "silu", "m": 1, "ms": None, "check": "FAIL"}, ("case", "m"))
    assert a == {"schema": SCHEMA, "bench": "fused-quant", "date": "2026-12-01T00:00:00Z", "command": "quantkit bench fused-quant --out x",
                 "env": {"device": "cpu", "torch": "2.13"}, "params": {"case": "rmsnorm", "m": 16}, "metrics": {"ms": 0.25, "check": "ok"}}
    assert read(path) == [a, b] and [json.loads(ln) for ln in path.read_text().splitlines()] == [a, b]
    assert flat(b) == {"case": "silu", "m": 1, "ms": None, "check": "FAIL"}


def test_a_parameter_the_row_lacks_is_refused_and_nothing_written(tmp_path):
    path = tmp_path / "r.jsonl"
    with pytest.raises(KeyError, match=r"\['k'\]"):
        RUN.write(path, Row("rmsnorm", 16, 0.25, "ok"), ("case", "k"))
    assert not path.exists()


def test_the_command_line_reruns_the_benchmark():
    assert command("quantkit.bench.fused_quant", ["--out", "a b", "--fi-backends", ""]) == "quantkit bench fused-quant --out 'a b' --fi-backends ''"
    assert command("quantkit.bench.kernels", []) == "quantkit bench kernels"
    started = Run.start("quantkit.bench.http_load", ["--url", "u"], {"device": "cpu"})
    assert started.bench == "http" and started.command == "quantkit bench http --url u" and started.date.endswith("Z")


def test_every_registered_benchmark_is_a_module_with_a_main():
    import importlib.util

    for name, module in BENCHMARKS.items():
        spec = importlib.util.find_spec(f"quantkit.bench.{module}")
        assert spec is not None and "def main(argv: list[str])" in open(spec.origin).read(), name
        assert command_name(f"quantkit.bench.{module}") == name and prog(f"quantkit.bench.{module}") == f"quantkit bench {name}"
    with pytest.raises(StopIteration):
        command_name("quantkit.bench.harness")  # a helper module is no benchmark


GOOD = RUN.record({"case": "a"}, {"ms": 1.0})


@pytest.mark.parametrize("change, problem", [
    ({"schema": "quantkit.bench/0"}, "schema 'quantkit.bench/0'"),
    ({"bench": ""}, "bench is not a non-empty string"),
    ({"command": None}, "command is not a non-empty string"),
    ({"env": []}, "env is not an object"),
    ({"env": {"sms": 132}}, "env holds a value that is not a string"),
    ({"params": "a"}, "params is not an object"),
    ({"metrics": {"case": "b"}}, "case is both a parameter and a metric"),
    ({"extra": 1}, "unknown key extra"),
    ({"table": ""}, "table is not a non-empty string"),
])  # fmt: skip
def test_problems_name_what_is_wrong(change, problem):
    assert problems(GOOD) == [] and problems({**GOOD, "table": "decode", "source": "s"}) == []
    assert any(problem in p for p in problems({**GOOD, **change})), problems({**GOOD, **change})
    assert problems({k: v for k, v in GOOD.items() if k != "metrics"}) == ["missing metrics"]
    assert problems([1]) == ["not a JSON object: list"]


def test_read_takes_flat_rows_and_refuses_bad_lines_by_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"concurrency": 1, "engine_tok_s": 3.0}) + "\n\n" + json.dumps(GOOD) + "\n")
    legacy, rec = read(path)
    assert flat(legacy) == {"concurrency": 1, "engine_tok_s": 3.0} and flat(rec) == {"case": "a", "ms": 1.0}
    for bad, why in (("{not json", "not a JSON row"), ("[1, 2]", "not a valid record: not a JSON object"),
                     (json.dumps({**GOOD, "env": {"x": 1}}), "not a valid record: env holds a value")):
        path.write_text(json.dumps(GOOD) + "\n" + bad + "\n")
        with pytest.raises(ValueError, match=f"{path}:2: {why}"):
            read(path)
