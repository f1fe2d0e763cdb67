"""Expert load: how often the engine's routers pick each routed expert on some text, per MoE layer.

The result is the file ``quantkit shard --placement balanced --expert-load FILE`` reads
(docs/shard.md)::

    {"layers": {"<layer>": [count of expert 0, ..., count of expert E-1], ...}, "tokens": N, "data": "..."}

A count is a (token, slot) routing: each token adds top-k.  Every MoE layer is counted, DeepSeek's
MTP layer too (its index is ``num_hidden_layers``, as in the checkpoint; shard asks for every MoE layer
it holds): the MTP layer runs on each window as DeepSeek's predictor does, the next token's embedding
beside the main model's hidden state.  The windows are ``eval accuracy``'s (the bundled text by
default, a text file, or random ids), run cache-less; the routers are read through forward hooks, so
the counts are the routing the served model does on that text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..engine import load
from ..engine.batch import Batch
from ..engine.layers.moe import MoE
from ..progress import Progress
from .data import make_windows


def _moe_layers(model) -> dict[int, MoE]:
    """Checkpoint layer index -> MoE module (the MTP layer at len(model.layers))."""
    blocks = list(enumerate(model.layers))
    if model.mtp is not None:
        blocks.append((len(model.layers), model.mtp.block))
    return {i: b.mlp for i, b in blocks if isinstance(b.mlp, MoE)}


@torch.no_grad()
def expert_load(ckpt: str | Path, data: str | None = None, tokens: int = 4096, ctx: int = 512, device: str = "cpu",
                dtype: str = "bfloat16", seed: int = 0, progress: str = "off") -> dict:
    """Routing counts per MoE layer over ``tokens // ctx`` windows of ``data``; see the module docstring.
    ``progress``: a :mod:`quantkit.progress` style."""
    model = load(ckpt, device, getattr(torch, dtype))
    layers = _moe_layers(model)
    if not layers:
        raise ValueError(f"{ckpt}: {model.family} has no MoE layers, so no expert load to count")
    counts = {i: torch.zeros(moe.experts.num_experts, dtype=torch.int64) for i, moe in layers.items()}

    def counter(i: int):
        def hook(_mod, _inp, out) -> None:  # a router returns (weights [T, k], expert ids [T, k])
            counts[i].add_(torch.bincount(out[1].flatten().cpu(), minlength=counts[i].numel()))
        return hook

    handles = [moe.router.register_forward_hook(counter(i)) for i, moe in layers.items()]
    try:
        win = make_windows(ckpt, data, tokens, ctx, int(model.config["vocab_size"]), seed)
        with Progress("expert load", win.tokens.shape[0], "window", progress) as bar:
            for ids in win.tokens.to(model.device):
                h = model.hidden(ids)
                if model.mtp is not None:  # predicts token t+2 from token t+1's embedding and token t's hidden state
                    n = ids.numel() - 1
                    model.mtp(ids[1:], h[:-1], Batch((0, n), torch.arange(1, n + 1, device=model.device)))
                bar.update(1)
    finally:
        for handle in handles:
            handle.remove()
    n_tokens = int(win.tokens.numel())
    return {"layers": {str(i): c.tolist() for i, c in counts.items()}, "tokens": n_tokens, "data": win.source}


def write_load(report: dict, out: str | Path, force: bool = False) -> Path:
    """Write the counts as JSON (through a temporary sibling, renamed: never a half-written file); an
    existing file only with ``force``."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists: pass --force to replace it")
    tmp = out.with_name(f".{out.name}.partial")
    tmp.write_text(json.dumps(report) + "\n")
    os.replace(tmp, out)
    return out
