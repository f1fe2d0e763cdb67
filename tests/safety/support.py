"""Shared pieces of the safety tests: the CLI runner, the one-error-line check, a side file linked outside."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from quantkit.cli import main

INDEX = "model.safetensors.index.json"
OUTSIDE = r"refused weight file: (its name leaves|it resolves to .*, outside) the checkpoint directory"


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(r) -> str:
    """The command's error: exactly one line, starting with "Error:"."""
    lines = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, r.output
    assert "Traceback" not in r.output, r.output
    return lines[0]


def side_symlink_outside(src: Path) -> None:
    secret = src.parent / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (src / "README.md").unlink()
    (src / "README.md").symlink_to(secret)
