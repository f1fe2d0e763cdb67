"""``quantkit shard`` on the command line: reports, --json, --dry-run, and clean errors."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from quantkit.cli import main

from .tiny import build as build_tiny


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    yield build_tiny("qwen3-moe", "source", root / "src")
    shutil.rmtree(root, ignore_errors=True)


def run(*args: str):
    return CliRunner().invoke(main, ["shard", *map(str, args)])


def test_listed_in_help():
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0 and "shard" in r.output


def test_json_report(src, tmp_path):
    r = run(src, tmp_path / "o", "--ep", 4, "--tp", 2, "--verify", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert (rep["world_size"], rep["ep"], rep["tp"], rep["dp"]) == (4, 4, 2, 2)
    assert rep["verify"]["ok"] and rep["gb_per_s"] > 0
    assert (tmp_path / "o" / "rank-00003-of-00004" / "config.json").exists()


def test_text_report_and_dry_run(src, tmp_path):
    r = run(src, tmp_path / "o", "--ep", 2, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "dry run" in r.output and "2 ranks: ep 2 = dp 2 x tp 1" in r.output
    assert not (tmp_path / "o").exists()
    r = run(src, tmp_path / "o", "--ep", 2, "--verify")
    assert r.exit_code == 0 and "tensors reassembled byte for byte from 2 ranks" in r.output and "GB/s" in r.output


@pytest.mark.parametrize("args,msg", [
    (["--ep", 2, "--placement", "balanced"], "needs --expert-load"),
    (["--ep", 4, "--tp", 2, "--dp", 4], "must equal --dp x --tp"),
    (["--ep", 3], "8 routed experts do not divide over --ep 3"),
    (["--ep", 2, "--tp", 2, "--max-shard-size", "lots"], "--max-shard-size"),
])
def test_errors_are_clean(src, tmp_path, args, msg):
    r = run(src, tmp_path / "o", *args)
    assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_existing_dst(src, tmp_path):
    (tmp_path / "o").mkdir()
    r = run(src, tmp_path / "o", "--ep", 2)
    assert r.exit_code == 1 and "already exists: pass --force" in r.output
    assert run(src, tmp_path / "o", "--ep", 2, "--force").exit_code == 0


def test_unsupported_architecture(tmp_path, src):
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    r = run(bad, tmp_path / "o", "--ep", 2)
    assert r.exit_code == 1 and "LlamaForCausalLM" in r.output and "is not supported" in r.output
