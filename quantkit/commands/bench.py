"""``quantkit bench NAME [OPTIONS]``: run one benchmark of :mod:`quantkit.bench`.

Each benchmark parses its own options (``quantkit bench NAME --help``), so a command here only passes its
arguments on.  Listing the benchmarks reads each module's docstring from its source: nothing torch-heavy is
imported until one runs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import click


def _module(name: str) -> str:
    from ..bench import BENCHMARKS

    return f"quantkit.bench.{BENCHMARKS[name]}"


def _summary(module: str) -> str:
    """The first line of a module's docstring, read from its source without importing it."""
    spec = importlib.util.find_spec(module)
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) if spec and spec.origin else None
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ")


def _command(name: str) -> click.Command:
    module = _module(name)

    def run(args: tuple[str, ...]) -> None:
        rc = importlib.import_module(module).main(list(args))
        if rc:
            raise SystemExit(rc)

    return click.Command(name, callback=run, help=_summary(module), add_help_option=False,
                         context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
                         params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)])  # fmt: skip


class BenchGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        from ..bench import BENCHMARKS

        return list(BENCHMARKS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        from ..bench import BENCHMARKS

        return _command(name) if name in BENCHMARKS else None


@click.group("bench", cls=BenchGroup)
def bench() -> None:
    """Benchmarks, sweeps and profiles (quantkit bench NAME --help for a benchmark's options).

    Each writes its records to OUT/results.jsonl (or WORK/ for convert and shard): one JSON line per
    measurement with the benchmark, its parameters, metrics, the environment and the command line.
    --device cpu, where a benchmark has it, is a smoke run (Triton's interpreter on tiny shapes)."""
