"""``quantkit shard SRC DST --ep N``: per-rank checkpoint directories for EP/TP/DP serving."""

from __future__ import annotations

import json

import click

from . import QUIET


@click.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("dst", type=click.Path())
@click.option("--ep", type=int, required=True, help="Expert-parallel size = number of ranks (EP = DP x TP).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size for attention and dense MLPs.")
@click.option("--dp", type=int, default=None, help="Data-parallel size of the attention (default EP / TP).")
@click.option("--placement", type=click.Choice(["contiguous", "round-robin", "balanced"]), default="contiguous",
              show_default=True, help="Routed expert -> rank map; balanced needs --expert-load.")
@click.option("--expert-load", type=click.Path(exists=True, dir_okay=False),
              help='JSON {"layers": {"<layer>": [count per expert]}}; reports max/mean load per rank.')
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest safetensors file per group.")
@click.option("--hardlinks/--no-hardlinks", default=True, show_default=True,
              help="Hard-link files shared by several ranks (replicated tensors, TP slices) instead of copying.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Threads writing group files in parallel (memory: one piece per worker).")
@click.option("--verify", "verify_output", is_flag=True, help="Reassemble every source tensor from the ranks before committing.")
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
@click.option("--dry-run", is_flag=True, help="Check and plan, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@QUIET
def shard(src: str, dst: str, ep: int, tp: int, dp: int | None, placement: str, expert_load: str | None,
          max_shard_size: str, hardlinks: bool, workers: int, verify_output: bool, force: bool, dry_run: bool, as_json: bool,
          quiet: bool) -> None:
    """Split checkpoint SRC into DST/rank-XXXXX-of-NNNNN/ for expert/tensor/data-parallel serving.

    Routed experts are partitioned over the EP ranks, attention and dense weights split over TP
    (KV heads replicated when TP exceeds them), everything else replicated; DST/quantkit.json
    holds the plan (rank coordinates, expert -> rank map, sha256 of every file)."""
    from ..checkpoint import CheckpointError
    from ..progress import style
    from ..shard import shard as run
    from ..shard.report import render

    try:
        rep = run(src, dst, ep=ep, tp=tp, dp=dp, placement=placement, expert_load=expert_load,
                  verify_output=verify_output, force=force, dry_run=dry_run, hardlinks=hardlinks,
                  max_shard_size=max_shard_size, workers=workers, progress=style(quiet))
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(rep, indent=2) if as_json else render(rep))
