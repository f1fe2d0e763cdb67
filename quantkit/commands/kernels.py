"""``quantkit kernels``: which leaf kernel runs for each op, format and M bucket on a device, and why."""

from __future__ import annotations

import json

import click


@click.command()
@click.option("--device", default=None,
              help="A torch device (cuda, cuda:1, cpu) or a named target (h200) to print the map of a GPU this machine "
                   "does not have.  Default: cuda where one is visible, else cpu.")  # fmt: skip
@click.option("--op", "ops", multiple=True, help="Only these ops (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def kernels(device: str | None, ops: tuple[str, ...], as_json: bool) -> None:
    """Print the kernel map: for each op, case (format, shape) and M bucket, the kernel that runs, its config and the
    one-line rule that chose it, as the dispatcher's selection functions decide it for DEVICE."""
    import torch

    from ..kernels import dispatch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device in dispatch.TARGETS:
        target = dispatch.TARGETS[device]
    else:
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise click.BadParameter(f"{device!r} is neither a torch device nor a named target ({', '.join(dispatch.TARGETS)})",
                                     param_hint="--device") from None  # fmt: skip
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise click.BadParameter(f"{device}: no CUDA device is visible; name a target instead ({', '.join(dispatch.TARGETS)})",
                                     param_hint="--device")  # fmt: skip
        target = dispatch.target(dev)
    real = None if device in dispatch.TARGETS else torch.device(device)
    unknown = sorted(set(ops) - set(dispatch.ops()))
    if unknown:
        raise click.BadParameter(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(dispatch.ops())}", param_hint="--op")
    rows = [r for r in dispatch.kernel_map(target) if not ops or r.op in ops]
    if as_json:
        click.echo(json.dumps([{"op": r.op, "case": r.case, "m": r.m, "kernel": r.choice.kernel, "config": None if r.choice.config is None
                                else str(r.choice.config), "reason": r.choice.reason} for r in rows], indent=2))  # fmt: skip
        return
    click.echo(f"# {target.name or target.type}: capability {target.capability[0]}.{target.capability[1]}, {target.sms} SMs")
    click.echo("| op | case | M | kernel | config | why |\n|---|---|---|---|---|---|")
    for r in rows:
        cfg = "" if r.choice.config is None else str(r.choice.config)
        click.echo(f"| {r.op} | {r.case} | {r.m} | {r.choice.kernel} | {cfg} | {r.choice.reason} |")
    mapped = {r.op for r in rows}
    rest = [op for op in dispatch.ops() if op not in mapped and (not ops or op in ops)]
    if rest:
        click.echo("\nOps of one kernel per backend: auto runs the highest-priority backend available for auto"
                   + (" (marked *)" if real is not None else "") + ":")
        for op in rest:
            auto = dispatch.which(op, real) if real is not None else None
            click.echo(f"- {op}: {', '.join(b + ('*' if b == auto else '') for b in dispatch.backends(op))}")
