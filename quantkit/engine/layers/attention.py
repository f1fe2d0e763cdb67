"""Attention: the GQA attention layer of GPT-OSS and Qwen3, and :func:`attend_batch`, which runs
the attention ops (:mod:`quantkit.kernels.attention.attention_ref`) over a :class:`Batch` for it and for MLA.

Masking is by position: query at position p sees keys at positions j <= p, and with a sliding
window W only j > p - W (transformers ``sliding_window_overlay``; GPT-OSS W=128 means keys
p-127..p, FlashInfer window_left=127).  Sinks (GPT-OSS, transformers ``eager_attention_forward``):
one logit per head joins the softmax denominator (after subtracting the row max, unscaled) and
its probability is dropped.  Scores, softmax and the weighted sum run in float32 (the ops' torch
reference :func:`attend`, which the Triton kernels are tested against).

Which op runs: with a KV cache whose entries are the keys and values themselves (GQA),
``attention_decode`` (one new token per sequence) or ``attention_prefill`` over the paged cache
(block tables); otherwise (no cache, or MLA's cached latents at prefill, expanded per sequence;
MLA decode steps run the absorbed ``mla_decode`` op instead, :mod:`.mla`)
``attention_prefill`` over ragged keys.  Keys sit at consecutive positions, queries are the last
ones (bottom-right aligned), as :class:`Batch` lays them out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ...kernels.attention.attention_ref import attend  # noqa: F401  (re-exported: the reference the layer tests use)
from ...kernels.dispatch import Dispatcher
from ..batch import Batch
from ..kv_cache import KVCache
from ..qlinear import Linear, RowGroup
from .norm import RMSNorm, norm_quantized
from .rope import Rope

Expand = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


def _ragged_kv(layer: int, batch: Batch, cache: KVCache | None, new: dict[str, torch.Tensor], expand: Expand | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's keys and values, concatenated: (k [Tk, Hkv, D], v [Tk, Hkv, Dv])."""
    if expand is None and cache is None:
        return new["k"], new["v"]
    ks, vs = [], []
    for b, (s, e) in enumerate(batch.segments()):  # expanded per sequence (MLA: kv_b_proj over its latents)
        ctx = {n: t[s:e] for n, t in new.items()} if cache is None else cache.read(layer, batch.context_slots(b))
        k, v = expand(ctx) if expand is not None else (ctx["k"], ctx["v"])
        ks.append(k)
        vs.append(v)
    return torch.cat(ks), torch.cat(vs)


def attend_batch(
    layer: int,
    batch: Batch,
    cache: KVCache | None,
    q: torch.Tensor,
    new: dict[str, torch.Tensor] | None,
    expand: Expand | None,
    *,
    scale: float,
    sinks: torch.Tensor | None = None,
    window: int | None = None,
    ops: Dispatcher | None = None,
) -> torch.Tensor:
    """Write this step's per-token cache entries ``new`` (None: written already), then attend each sequence to its context.

    ``expand`` turns cached (or new) entries into (k, v) [m, Hkv, D|Dv]; None means the entries
    are ``k`` and ``v`` themselves, read in place from the paged cache.  ``ops``: the model's
    dispatcher (default: a fresh one, backend auto).  Returns [T, Hq, Dv] in q's dtype.
    """
    ops = ops if ops is not None else Dispatcher()
    if cache is not None:
        if not batch.uses_cache:
            raise ValueError("a KV cache was given but the batch has no slots: build it with KVCache.schedule")
        if new is not None:
            cache.write(layer, batch.slot_mapping, new)
    m = batch.attn
    if cache is not None and expand is None:
        k, v = cache.layers[layer]["k"], cache.layers[layer]["v"]  # [slots, Hkv, D]
        if m.decode:
            return ops.call("attention_decode", q, k, v, batch.block_tables, m.context_lens, batch.block_size, scale, sinks, window)
        return ops.call(
            "attention_prefill", q, k, v, m.cu_seqlens_q, m.cu_seqlens_k, scale, sinks, window,
            batch.block_tables, batch.block_size, m.max_seqlen_q,
        )  # fmt: skip
    k, v = _ragged_kv(layer, batch, cache, new, expand)
    return ops.call("attention_prefill", q, k, v, m.cu_seqlens_q, m.cu_seqlens_k, scale, sinks, window, max_seqlen_q=m.max_seqlen_q)


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
        ops: Dispatcher | None = None,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.qkv = RowGroup((q_proj, k_proj, v_proj))  # one GEMM where the three stack (qlinear.fuse_rows)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope = rope
        self.register_buffer("sinks", sinks)
        self.window = window
        self.q_norm, self.k_norm = q_norm, k_norm
        self.scale = head_dim**-0.5
        self.ops = ops if ops is not None else Dispatcher()

    def cache_spec(self) -> dict[str, tuple[int, ...]]:
        return {"k": (self.num_kv_heads, self.head_dim), "v": (self.num_kv_heads, self.head_dim)}

    def forward(self, x: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        return self._attend(*self.qkv(x, views=True), batch, cache)

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        """forward(norm(x)); the norm fused with the q/k/v projections' input quantization where
        they all quantize alike (:func:`.norm.norm_quantized`)."""
        a = norm_quantized(norm, self.qkv.parts, x)
        if a is None:
            return self.forward(norm(x), batch, cache)
        return self._attend(*self.qkv.quantized(*a, x.dtype, views=True), batch, cache)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        """q, k, v [T, N_i] (views of one GEMM output where the projections fused) -> o_proj of the attention."""
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if cache is not None and batch.uses_cache and all(self.rope.kernel_ok(a) for a in (q, k, v)):
            # RoPE and the cache write as one op (rope_cache_write): q, k, v read in place
            cos, sin = self.rope.table(batch.positions, batch, q.dtype)
            entries = cache.layers[self.layer]
            q = self.ops.call("rope_cache_write", q, k, v, cos[:, 0], sin[:, 0], self.rope.style, batch.slot_mapping, entries["k"], entries["v"])
            new = None
        else:
            q, k = self.rope(q, batch.positions, batch, self.ops), self.rope(k, batch.positions, batch, self.ops)
            new = {"k": k, "v": v}
        o = attend_batch(self.layer, batch, cache, q, new, None, scale=self.scale, sinks=self.sinks, window=self.window, ops=self.ops)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))
