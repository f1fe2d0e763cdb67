"""``quantkit synth FAMILY DST``: a checkpoint in the exact upstream layout, with random weights."""

from __future__ import annotations

import json

import click

from . import QUIET


@click.command()
@click.argument("family")
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--preset", default="tiny", show_default=True,
              help="tiny, tiny-ragged, or a full-size shape: gpt-oss-20b, gpt-oss-120b, deepseek-v3, qwen3-8b, "
                   "qwen3-30b-a3b, qwen3-235b-a22b.")
@click.option("--layers", type=int, default=None, help="Number of decoder layers (cuts a full-size preset's depth).")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, byte-identical tensor files.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest safetensors shard, e.g. 5GB, 500MiB.")
@click.option("--layout", type=click.Choice(["root", "original"]), default="root", show_default=True,
              help="gpt-oss only: 'original' writes OpenAI's original/ layout alone.")
@click.option("--scale-fmt", type=click.Choice(["float", "ue8m0"]), default="float", show_default=True,
              help="deepseek-v3 only: FP8 block scales as float (V3/R1) or powers of two (V3.1).")
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@QUIET
def synth(family: str, dst: str, preset: str, layers: int | None, seed: int, max_shard_size: str, layout: str,
          scale_fmt: str, force: bool, as_json: bool, quiet: bool) -> None:
    """Write a FAMILY checkpoint (gpt-oss, deepseek-v3, qwen3, qwen3-moe) with random weights to DST:
    config, tokenizer, safetensors in the exact upstream layout, quantkit.json."""
    from ..checkpoint import CheckpointError
    from ..progress import style
    from ..synth import synthesize

    try:
        rep = synthesize(family, dst, preset=preset, layers=layers, seed=seed, max_shard_size=max_shard_size,
                         layout=layout, force=force, scale_fmt=scale_fmt, progress=style(quiet))
    except (CheckpointError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    click.echo(f"{rep['path']}: {rep['family']} preset {rep['preset']} ({rep['layers']} layers, layout {rep['layout']}, "
               f"seed {rep['seed']})")
    click.echo(f"{rep['tensors']} tensors, {rep['files']} shard(s), {rep['bytes'] / 1e6:.1f} MB in {rep['seconds']:.2f} s "
               f"({rep['mb_per_s']:.0f} MB/s)")
