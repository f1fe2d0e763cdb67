"""Convenience drivers over :meth:`CausalLM.forward`: batched prefill, per-layer hidden states, greedy decoding."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .batch import Batch
from .model import CausalLM


def _ids(seqs: Sequence[Sequence[int] | torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    return [torch.as_tensor(s, dtype=torch.int64, device=device).reshape(-1) for s in seqs]


@torch.no_grad()
def prefill_logits(model: CausalLM, sequences: Sequence[Sequence[int] | torch.Tensor]) -> list[torch.Tensor]:
    """Logits float32 [len, vocab] of each sequence, all run as one cache-less batch."""
    ids = _ids(sequences, model.device)
    batch = Batch.prefill([len(s) for s in ids], model.device)
    logits = model(torch.cat(ids), batch.positions, None, batch)
    return [logits[s:e] for s, e in batch.segments()]


@torch.no_grad()
def hidden_states(model: CausalLM, input_ids: Sequence[int] | torch.Tensor) -> list[torch.Tensor]:
    """One sequence's hidden states [len, H], num_layers + 1 of them, as transformers'
    ``output_hidden_states`` gives them: the embedding output, each decoder layer's output, the last
    one after the final norm.  (``CausalLM.hidden(collect=...)`` keeps the last one un-normed.)"""
    (ids,) = _ids([input_ids], model.device)
    raw: list[torch.Tensor] = []
    final = model.hidden(ids, collect=raw)
    return raw[:-1] + [final]


@torch.no_grad()
def greedy(model: CausalLM, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int, block_size: int = 16) -> list[list[int]]:
    """Greedy continuation of each prompt through a paged KV cache: one batched prefill, then
    batched one-token decode steps.  Returns the new tokens of each prompt."""
    ids = _ids(prompts, model.device)
    need = sum(-(-(len(p) + max_new_tokens) // block_size) for p in ids)
    cache = model.new_cache(need, block_size)
    step = cache.schedule({i: len(p) for i, p in enumerate(ids)})
    tokens, out = torch.cat(ids), [[] for _ in ids]
    for n in range(max_new_tokens):
        tokens = model(tokens, step.positions, cache, step, rows=step.last_token_rows()).argmax(-1)
        for i, t in enumerate(tokens.tolist()):
            out[i].append(t)
        if n + 1 < max_new_tokens:
            step = cache.schedule({i: 1 for i in range(len(ids))})
    return out
