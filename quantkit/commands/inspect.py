"""``quantkit inspect CKPT``: family, formats, sizes and problems of a checkpoint."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False))
@click.option("--tensors", is_flag=True, help="List every tensor with dtype, shape and format.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect(ckpt: str, tensors: bool, as_json: bool) -> None:
    """Tell what checkpoint CKPT is: family, weight formats, parameters, bytes, problems.

    Exits 1 when a problem is found (missing or mis-shaped scale, shape disagreeing with the
    config, MX tensor whose K is not a multiple of 32, ...)."""
    from ..checkpoint import CheckpointError
    from ..inspect import inspect as run, render

    try:
        rep = run(ckpt, tensors=tensors)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(rep.as_dict(), indent=2) if as_json else render(rep))
    if rep.problems:
        raise SystemExit(1)
