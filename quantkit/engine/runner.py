"""The one door between serving and the model: a scheduled step in, logits out.

The scheduler (:mod:`quantkit.serve.scheduler`) decides which sequences run and how many tokens each
adds; :func:`forward_step` allocates their cache slots and runs the model.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from .model import CausalLM


def forward_step(model: CausalLM, cache, order: list[tuple[Hashable, int]], tokens: torch.Tensor, rows: list[int]) -> torch.Tensor | None:
    """Allocate the step's cache slots and run the model: logits float32 [len(rows), V] on the model's
    device, or None when no row is wanted (prefill chunks only: their keys and values go to the cache)."""
    batch = cache.schedule(dict(order))
    tokens = tokens.to(model.device)
    if rows:
        return model(tokens, batch.positions, cache, batch, rows=rows)
    model.hidden(tokens, batch.positions, cache, batch)
    return None
