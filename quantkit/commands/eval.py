"""``quantkit eval accuracy CAND [CAND ...] --reference SRC``: logits of candidates vs a reference."""

from __future__ import annotations

import json
from pathlib import Path

import click

from . import QUIET


@click.group("eval")
def eval_group() -> None:
    """Measure converted checkpoints against their source."""


def _device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@eval_group.command()
@click.argument("candidates", nargs=-1, required=True, metavar="CAND...", type=click.Path(exists=True, file_okay=False))
@click.option("--reference", "reference", required=True, metavar="SRC", type=click.Path(exists=True, file_okay=False),
              help="Source checkpoint the candidates were converted from.")
@click.option("--impl", type=click.Choice(["transformers", "gpt-oss", "engine"]), default="transformers", show_default=True,
              help="Reference implementation run on SRC (engine: the bundled engine, for models transformers cannot hold).")
@click.option("--data", default=None, metavar="FILE|random",
              help="Text file to tokenize with SRC's tokenizer, or 'random' for random token ids. "
                   "Default: the bundled public-domain text (random tokens when SRC has no tokenizer.json).")
@click.option("--tokens", type=click.IntRange(min=4), default=4096, show_default=True,
              help="Tokens run through each model: tokens // ctx windows; the second half of each window is scored.")
@click.option("--ctx", type=click.IntRange(min=4), default=512, show_default=True, help="Window length in tokens.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="Activation dtype of the engine on the candidates (every reference runs float32).")
@click.option("--act-quant/--no-act-quant", default=True, show_default=True,
              help="Quantize candidate activations dynamically as served (off: weight error alone).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random-token windows.")
@click.option("--no-hidden", is_flag=True, help="Skip the per-layer hidden-state comparison.")
@click.option("--max-kld", type=float, default=None, help="Gate: exit 1 when a candidate's mean KLD exceeds this.")
@click.option("--min-top1", type=click.FloatRange(0, 100), default=None,
              help="Gate: exit 1 when a candidate's same-top-1 share (percent) is below this.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of markdown.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a PNG of the per-token KLD distributions.")
@QUIET
@click.option("--no-progress", is_flag=True, hidden=True, help="The old name of --quiet.")
def accuracy(candidates: tuple[str, ...], reference: str, impl: str, data: str | None, tokens: int, ctx: int,
             device: str, dtype: str, act_quant: bool, seed: int, no_hidden: bool, max_kld: float | None, min_top1: float | None,
             as_json: bool, plot: str | None, quiet: bool, no_progress: bool) -> None:
    """Run the reference on SRC and the engine on each CAND over the same token windows; report
    llama.cpp's --kl-divergence statistics per candidate, side by side (markdown on stdout).

    With --max-kld / --min-top1 this is a gate: exit status 1 when any candidate fails."""
    from ..eval.accuracy import evaluate
    from ..eval.report import PlotUnavailable, plot_kld, render_markdown, require_matplotlib
    from ..progress import style

    if data is not None and data != "random" and not Path(data).is_file():
        raise click.ClickException(f"--data {data}: no such file (or use --data random)")
    if plot is not None and not Path(plot).resolve().parent.is_dir():
        raise click.ClickException(f"--plot {plot}: its directory does not exist")
    try:
        if plot is not None:
            require_matplotlib()  # fail before any model runs
        rep = evaluate(list(candidates), reference, impl=impl, data=data, tokens=tokens, ctx=ctx, device=_device(device),
                       dtype=dtype, act_quant=act_quant, seed=seed, hidden=not no_hidden, max_kld=max_kld, min_top1=min_top1,
                       progress=style(quiet or no_progress))
    except (ValueError, PlotUnavailable) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(rep.as_dict(), indent=2) if as_json else render_markdown(rep))
    if plot is not None:
        click.echo(f"wrote {plot_kld(rep, plot)}", err=True)
    if not rep.passed:
        raise SystemExit(1)


@eval_group.command("expert-load")
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="JSON file to write: shard's --expert-load.")
@click.option("--data", default=None, metavar="FILE|random",
              help="Text file to tokenize with CKPT's tokenizer, or 'random'. Default: the bundled public-domain text.")
@click.option("--tokens", type=click.IntRange(min=4), default=4096, show_default=True, help="Tokens routed: tokens // ctx windows.")
@click.option("--ctx", type=click.IntRange(min=4), default=512, show_default=True, help="Window length in tokens.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="bfloat16", show_default=True)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@QUIET
def expert_load(ckpt: str, out: str, data: str | None, tokens: int, ctx: int, device: str, dtype: str, force: bool, as_json: bool,
                quiet: bool) -> None:
    """Count how often the engine's routers pick each routed expert of every MoE layer (DeepSeek's MTP
    layer too) on some text: the --expert-load file of `quantkit shard --placement balanced`."""
    from ..eval.expert_load import expert_load as count, write_load
    from ..progress import style

    if Path(out).exists() and not force:
        raise click.ClickException(f"{out} exists: pass --force to replace it")
    if data is not None and data != "random" and not Path(data).is_file():
        raise click.ClickException(f"--data {data}: no such file (or use --data random)")
    try:
        rep = count(ckpt, data=data, tokens=tokens, ctx=ctx, device=_device(device), dtype=dtype, progress=style(quiet))
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    write_load(rep, out, force=True)
    if as_json:
        click.echo(json.dumps(rep))
    else:
        click.echo(f"wrote {out}: routing counts of {len(rep['layers'])} MoE layers over {rep['tokens']} tokens ({rep['data']})")
