"""``quantkit synth``: the report, --json, and every refusal (with nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main


def _run(*args: str):
    return CliRunner().invoke(main, ["synth", *args])


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_json_report_and_text_report(tmp_path: Path) -> None:
    r = _run("qwen3", str(tmp_path / "q"), "--seed", "3", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["family"] == "qwen3" and rep["preset"] == "tiny" and rep["seed"] == 3 and rep["layers"] == 2
    assert rep["tensors"] == 25 and rep["bytes"] > 1e6 and rep["seconds"] > 0
    manifest = json.loads((tmp_path / "q" / "quantkit.json").read_text())
    assert manifest["command"] == "synth" and manifest["options"]["seed"] == 3
    r = _run("qwen3-moe", str(tmp_path / "m"), "--layers", "1")
    assert r.exit_code == 0, r.output
    assert "qwen3-moe preset tiny (1 layers" in r.output and "MB/s" in r.output


def test_existing_dst_needs_force(tmp_path: Path) -> None:
    dst = tmp_path / "g"
    assert _run("gpt-oss", str(dst)).exit_code == 0
    before = (dst / "model-00001-of-00001.safetensors").stat().st_mtime_ns
    r = _run("gpt-oss", str(dst), "--seed", "1")
    assert r.exit_code != 0 and "already exists" in r.output and "--force" in r.output
    assert (dst / "model-00001-of-00001.safetensors").stat().st_mtime_ns == before
    r = _run("gpt-oss", str(dst), "--seed", "1", "--force", "--layout", "original")
    assert r.exit_code == 0, r.output
    assert (dst / "original" / "model.safetensors").exists() and not (dst / "model-00001-of-00001.safetensors").exists()
    assert _leftovers(tmp_path) == ["g"]


@pytest.mark.parametrize(("args", "message"), [
    (["qwen3", "--preset", "gpt-oss-20b"], "has no preset 'gpt-oss-20b'"),
    (["deepseek-v3", "--layout", "original"], "applies to gpt-oss only"),
    (["gpt-oss", "--scale-fmt", "ue8m0"], "applies to deepseek-v3 only"),
    (["qwen3", "--layers", "0"], "at least 1"),
    (["qwen3", "--max-shard-size", "lots"], "cannot read size"),
])
def test_bad_options_write_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    r = _run(args[0], str(tmp_path / "x"), *args[1:])
    assert r.exit_code != 0 and message in r.output, r.output
    assert "Traceback" not in r.output
    assert _leftovers(tmp_path) == []


def test_unknown_family_is_refused(tmp_path: Path) -> None:
    r = _run("llama", str(tmp_path / "x"))
    assert r.exit_code != 0 and "llama" in r.output
    assert _leftovers(tmp_path) == []
