"""The one door between serving and the model: a scheduled step in, logits out.

The scheduler (:mod:`quantkit.serve.scheduler`) decides which sequences run and how many tokens each
adds; :func:`forward_step` allocates their cache slots and runs the model.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from .model import CausalLM
from .parallel import idle_step


def forward_step(model: CausalLM, cache, order: list[tuple[Hashable, int]], tokens: torch.Tensor, rows: list[int],
                 group_sizes: list[int] | None = None) -> torch.Tensor | None:
    """Allocate the step's cache slots and run the model: logits float32 [len(rows), V] on the model's
    device, or None when no row is wanted (prefill chunks only: their keys and values go to the cache).

    ``group_sizes``: with DP groups, every group's token count this step (the MoE layers' exchange needs
    them); a group with an empty ``order`` then only joins the exchange."""
    if group_sizes is not None and model.dp_exchange is not None:  # a dense model's groups never meet
        if not order:
            idle_step(model, group_sizes)
            return None
        model.dp_exchange.begin(group_sizes)
    if not order:
        return None
    batch = cache.schedule(dict(order))
    tokens = tokens.to(model.device)
    if rows:
        return model(tokens, batch.positions, cache, batch, rows=rows)
    model.hidden(tokens, batch.positions, cache, batch)
    return None
