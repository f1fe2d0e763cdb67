"""The CLI starts fast: ``quantkit --help`` imports no torch and every registered command loads."""

from __future__ import annotations

import subprocess
import sys
import time

from click.testing import CliRunner

from quantkit.cli import COMMANDS, main


def test_help_imports_no_torch_and_is_fast() -> None:
    code = "import sys; from quantkit.cli import main; main(['--help'], standalone_mode=False); print('torch' in sys.modules)"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - t
    assert out.stdout.strip().endswith("False"), "quantkit --help imported torch"
    assert elapsed < 2.0, f"quantkit --help took {elapsed:.2f}s"
    for name in COMMANDS:
        assert name in out.stdout


def test_every_command_has_help() -> None:
    runner = CliRunner()
    for name in COMMANDS:
        r = runner.invoke(main, [*name.split(), "--help"])
        assert r.exit_code == 0, (name, r.output)
        assert "Usage:" in r.output


def test_unknown_command_fails() -> None:
    r = CliRunner().invoke(main, ["frobnicate"])
    assert r.exit_code != 0 and "No such command" in r.output
