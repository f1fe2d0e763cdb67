"""``quantkit inspect CKPT``: family, formats, sizes and problems of a checkpoint."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False))
@click.option("--tensors", is_flag=True, help="List every tensor with dtype, shape and format.")
@click.option("--values/--headers-only", default=True, show_default=True,
              help="Scan every tensor for NaN/Inf (and E4M3 / E8M0 NaN bytes) and FP8 block scales for zero or negative "
                   "values (reads all the data), or read the headers only.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect(ckpt: str, tensors: bool, values: bool, as_json: bool) -> None:
    """Tell what checkpoint CKPT is: family, weight formats, parameters, bytes, problems.

    Exits 1 when a problem is found (missing or mis-shaped scale, shape disagreeing with the
    config, MX tensor whose K is not a multiple of 32, NaN/Inf values, zero or negative block scales, ...)."""
    from ..checkpoint import CheckpointError
    from ..inspect import inspect as run, render

    try:
        rep = run(ckpt, tensors=tensors, values=values)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(rep.as_dict(), indent=2) if as_json else render(rep))
    if rep.problems:
        raise SystemExit(1)
