"""The ``quantkit`` command line: a click group whose commands are imported only when invoked.

Each command lives in ``quantkit/commands/<name>.py``, parses its options, calls one function and
prints that function's report.  Command modules import nothing heavier than click at module
level, so ``quantkit --help`` stays fast.
"""

from __future__ import annotations

import importlib

import click

from . import __version__

# command name -> "module:attribute" (the one registry of commands)
COMMANDS: dict[str, str] = {
    "synth": "quantkit.commands.synth:synth",
    "inspect": "quantkit.commands.inspect:inspect",
    "convert": "quantkit.commands.convert:convert",
    "shard": "quantkit.commands.shard:shard",
    "eval": "quantkit.commands.eval:eval_group",
    "serve": "quantkit.commands.serve:serve",
    "kernels": "quantkit.commands.kernels:kernels",
    "bench": "quantkit.commands.bench:bench",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        mod, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(mod), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="quantkit")
def main() -> None:
    """Requantize, shard, verify and serve open-weight MoE checkpoints.

    GPT-OSS (MXFP4), DeepSeek-V3/R1 (FP8 128x128 blocks) and Qwen3 / Qwen3-MoE (BF16)."""


if __name__ == "__main__":
    main()
