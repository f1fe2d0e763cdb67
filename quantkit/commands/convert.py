"""``quantkit convert SRC DST --to FORMAT``: requantize a checkpoint, streaming, atomic, verified."""

from __future__ import annotations

import json

import click

from . import QUIET, RegistryChoice


def targets() -> list[str]:
    """The registered formats ``convert`` writes (:func:`quantkit.formats.convert_targets`)."""
    from ..formats import convert_targets

    return convert_targets()


@click.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("dst", type=click.Path())
@click.option("--to", "to", required=True, type=RegistryChoice(targets), help="Target format (mxfp4: GPT-OSS's own layout for its experts; compressed-tensors MXFP4 for other families).")
@click.option("--rounding", type=click.Choice(["nearest", "stochastic"]), default="nearest", show_default=True,
              help="Element rounding (exact paths round nothing).")
@click.option("--seed", type=int, default=None, help="Seed of --rounding stochastic (default 0).")
@click.option("--scale-rule", type=click.Choice(["floor", "rceil"]), default=None,
              help="E8M0 scale rule for mxfp8, mxfp4 and ue8m0 fp8-block scales (default rceil: never clips, as cuBLAS/TransformerEngine).")
@click.option("--scale-fmt", type=click.Choice(["float", "ue8m0"]), default=None,
              help="fp8-block scale format (default: the source's fp8-block format, else float).")
@click.option("--ignore", multiple=True, metavar="GLOB", help="Keep matching weights (or modules) in source precision; repeatable.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes, one shard each at a time.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Output shard size limit, e.g. 5GB, 500MiB.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run, keeping shards whose sha256 matches.")
@click.option("--force", is_flag=True, help="Replace DST if it exists (only once the new one is complete).")
@click.option("--dry-run", is_flag=True, help="Plan and report; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@QUIET
def convert(src: str, dst: str, to: str, rounding: str, seed: int | None, scale_rule: str | None, scale_fmt: str | None,
            ignore: tuple[str, ...], device: str, workers: int, max_shard_size: str, resume: bool, force: bool,
            dry_run: bool, as_json: bool, quiet: bool) -> None:
    """Convert checkpoint SRC (GPT-OSS, DeepSeek-V3/R1/V3.1, Qwen3, Qwen3-MoE) into DST in format --to.

    Writes DST atomically with quantkit.json (options, source fingerprint, per-file sha256,
    per-tensor fidelity). Exact conversions (MXFP4 -> MXFP8, power-of-two FP8-block -> MXFP8,
    same format) are taken automatically and reported."""
    from ..checkpoint import CheckpointError, parse_size
    from ..converters import ConvertOptions, OptionError, convert as run
    from ..converters.report import render
    from ..progress import Progress, style

    try:
        shard_size = parse_size(max_shard_size)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--max-shard-size") from None
    try:
        opts = ConvertOptions(to=to, rounding=rounding, seed=seed, scale_rule=scale_rule, scale_fmt=scale_fmt,
                              ignore=ignore, device=device, workers=workers, max_shard_size=shard_size,
                              resume=resume, force=force, dry_run=dry_run)
        with Progress("convert", style="off" if dry_run else style(quiet)) as bar:
            rep = run(src, dst, opts, progress=bar.update, start=bar.reset)
    except (CheckpointError, OptionError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(rep, indent=2) if as_json else render(rep))
