"""The README's tiny Usage block runs as written, in order, in an empty directory: each line is parsed
as the shell would split it (comments dropped) and run through the quantkit command line in this process
(the same click entry point as the ``quantkit`` script, without a new interpreter per line)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from click.testing import CliRunner

from quantkit.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
MARK = "<!-- tests/test_readme.py runs the indented lines below, in order -->"


def usage_lines() -> list[str]:
    """The indented lines right after MARK, up to the first line that is not."""
    text = README.read_text()
    assert MARK in text, f"README.md lost its marker {MARK!r}"
    lines = []
    for line in text.split(MARK, 1)[1].lstrip("\n").splitlines():
        if not line.startswith("    "):
            break
        lines.append(line.strip())
    return lines


def test_the_usage_block_runs_top_to_bottom(tmp_path, monkeypatch):
    lines = usage_lines()
    assert len(lines) >= 10 and all(line.startswith("quantkit ") for line in lines), lines
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for line in lines:
        r = runner.invoke(main, shlex.split(line, comments=True)[1:], catch_exceptions=False)
        assert r.exit_code == 0, f"{line}\n{r.output[-3000:]}"
    load = json.loads((tmp_path / "load.json").read_text())["layers"]
    assert set(load) == {"1", "2"}  # DeepSeek tiny: layer 0 dense, layer 1 MoE, layer 2 the MTP layer
    # top-2 routing over 4 windows of 256 tokens; the MTP layer predicts from 255 positions of each window
    assert sum(load["1"]) == 2 * 1024 and sum(load["2"]) == 2 * 4 * 255
    man = json.loads((tmp_path / "ckpt/dsv3-ep4-tp2/quantkit.json").read_text())
    assert man["parallel"]["tp"] == 2 and man["parallel"]["world_size"] == 4
    assert {p.name for p in tmp_path.iterdir()} == {"ckpt", "load.json"}  # nothing else left behind
