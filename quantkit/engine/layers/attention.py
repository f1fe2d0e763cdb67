"""Attention: the reference softmax(q k^T * scale) v with per-head sinks and sliding windows, and
the GQA attention layer of GPT-OSS and Qwen3.

Masking is by position: query at position p sees keys at positions j <= p, and with a sliding
window W only j > p - W (transformers ``sliding_window_overlay``; GPT-OSS W=128 means keys
p-127..p, FlashInfer window_left=127).  Sinks (GPT-OSS, transformers ``eager_attention_forward``):
one logit per head joins the softmax denominator (after subtracting the row max, unscaled) and
its probability is dropped.  Scores, softmax and the weighted sum run in float32.

The layers loop over the sequences of a :class:`Batch` (this is the reference path; a paged
attention kernel replaces :func:`attend_batch` later with the same inputs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...kernels.attention import attend  # the torch twin the attention kernels are tested against
from ..batch import Batch
from ..kv_cache import KVCache
from ..qlinear import Linear
from .norm import RMSNorm
from .rope import Rope


def attend_batch(
    layer: int,
    batch: Batch,
    cache: KVCache | None,
    q: torch.Tensor,
    new: dict[str, torch.Tensor],
    expand: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]],
    **kw,
) -> torch.Tensor:
    """Write this step's per-token cache entries ``new``, then attend each sequence to its context.

    ``expand`` turns a sequence's cached entries into (k, v) [m, Hkv, D]; the result is [T, Hq, Dv] in q's dtype.
    """
    if cache is not None:
        if not batch.uses_cache:
            raise ValueError("a KV cache was given but the batch has no slots: build it with KVCache.schedule")
        cache.write(layer, batch.slot_mapping, new)
    out = []
    for b, (s, e) in enumerate(batch.segments()):
        if cache is None:
            ctx, k_pos = {n: t[s:e] for n, t in new.items()}, batch.positions[s:e]
        else:
            slots = batch.context_slots(b)
            ctx, k_pos = cache.read(layer, slots), torch.arange(slots.shape[0], device=q.device)
        k, v = expand(ctx)
        out.append(attend(q[s:e], k, v, batch.positions[s:e], k_pos, **kw))
    return torch.cat(out).to(q.dtype)


class Attention(nn.Module):
    """GQA attention: q/k/v/o projections (+biases), optional per-head q/k RMSNorm before RoPE
    (Qwen3), optional sinks and sliding window (GPT-OSS)."""

    def __init__(
        self,
        layer: int,
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
        o_proj: Linear,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rope: Rope,
        sinks: torch.Tensor | None = None,
        window: int | None = None,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope = rope
        self.register_buffer("sinks", sinks)
        self.window = window
        self.q_norm, self.k_norm = q_norm, k_norm
        self.scale = head_dim**-0.5

    def cache_spec(self) -> dict[str, tuple[int, ...]]:
        return {"k": (self.num_kv_heads, self.head_dim), "v": (self.num_kv_heads, self.head_dim)}

    def forward(self, x: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, batch.positions), self.rope(k, batch.positions)
        o = attend_batch(
            self.layer, batch, cache, q, {"k": k, "v": v}, lambda c: (c["k"], c["v"]),
            scale=self.scale, sinks=self.sinks, window=self.window,
        )
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))
