"""The causal LM every family wires: embedding, pre-norm decoder layers, final norm, lm_head.

``forward(input_ids [T], positions [T], kv_cache, batch)`` -> logits [T, vocab] (float32) over
the flat tokens of a :class:`Batch` (prefill chunks and decode steps of several sequences).
Per-layer hidden states (the embedding output, then each layer's output, before the final
norm: transformers' ``output_hidden_states`` up to its last entry, which is normed there) are
collected by passing a list as ``collect``.
"""

from __future__ import annotations

import torch
from torch import nn

from .batch import Batch
from .kv_cache import KVCache
from .layers.mlp import MLP
from .layers.norm import RMSNorm, add_norm
from .qlinear import Fp8Block, Linear, RowGroup


class DecoderLayer(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); attention modules and dense MLPs take the norm (``forward_normed``)."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, input_norm: RMSNorm, post_attn_norm: RMSNorm) -> None:
        super().__init__()
        self.self_attn, self.mlp = attn, mlp
        self.input_layernorm, self.post_attention_layernorm = input_norm, post_attn_norm

    def forward(self, x: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        a = self.self_attn.forward_normed(self.input_layernorm, x, batch, cache)  # the norm may fuse with q/k/v's input quantization
        if isinstance(self.mlp, MLP):  # dense: the norm may fuse with gate/up's input quantization
            x = x + a
            return x + self.mlp.forward_normed(self.post_attention_layernorm, x)
        x, h = add_norm(self.post_attention_layernorm, x, a, getattr(self.self_attn, "ops", None))  # one op in bf16
        return x + self.mlp(h)


class CausalLM(nn.Module):
    def __init__(
        self,
        family: str,
        config: dict,
        embed: torch.Tensor,
        layers: list[DecoderLayer],
        norm: RMSNorm,
        lm_head: Linear,
        dtype: torch.dtype,
        mtp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.family, self.config, self.dtype = family, config, dtype
        self.register_buffer("embed_tokens", embed)
        self.layers = nn.ModuleList(layers)
        self.norm, self.lm_head = norm, lm_head
        self.mtp = mtp  # DeepSeek's multi-token-prediction layer, cache layer len(layers)
        self.embed_parallel = None  # tensor parallel: this rank's vocabulary rows (..parallel.VocabParallelEmbedding)
        self.dp_exchange = None  # DP groups: the MoE layers' token exchange (..parallel.DPExchange)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def cache_specs(self) -> list[dict[str, tuple[int, ...]]]:
        specs = [layer.self_attn.cache_spec() for layer in self.layers]
        if self.mtp is not None:
            specs.append(self.mtp.block.self_attn.cache_spec())
        return specs

    def kv_bytes_per_token(self) -> int:
        """Bytes one token takes in the KV cache, over every attention layer (MTP included)."""
        return sum(int(torch.Size(shape).numel()) for spec in self.cache_specs() for shape in spec.values()) * self.dtype.itemsize

    def new_cache(self, num_blocks: int, block_size: int = 16) -> KVCache:
        """An empty paged KV cache for this model (one entry per attention layer)."""
        return KVCache(self.cache_specs(), num_blocks, block_size, self.dtype, self.device)

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        batch: Batch | None = None,
        collect: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [T, H]."""
        if batch is None:
            if kv_cache is not None:
                raise ValueError("with a KV cache, pass the Batch from kv_cache.schedule(...)")
            t = input_ids.shape[0]
            batch = Batch((0, t), positions if positions is not None else torch.arange(t, device=input_ids.device))
        elif positions is not None and not torch.equal(positions, batch.positions):
            raise ValueError("positions differ from the batch's positions")
        batch.check(input_ids)
        x = self.embed_tokens[input_ids] if self.embed_parallel is None else self.embed_parallel(self.embed_tokens, input_ids)
        if collect is not None:
            collect.append(x)
        for layer in self.layers:
            x = layer(x, batch, kv_cache)
            if collect is not None:
                collect.append(x)
        return self.norm(x)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        batch: Batch | None = None,
        collect: list[torch.Tensor] | None = None,
        rows: list[int] | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits float32 [T, vocab], or [len(rows), vocab] for the given rows of the flat tokens only
        (a server needs just ``batch.last_token_rows()``)."""
        h = self.hidden(input_ids, positions, kv_cache, batch, collect)
        return self.lm_head(h if rows is None else h[rows]).to(torch.float32)

    def gemm_shapes(self) -> set[tuple[int, int]]:
        """(N, K) of the fp8-block GEMMs this model runs through its dispatcher with quantized activations: every
        such linear (one expert's matrix for stacked experts) and the row groups' fused projections (made now,
        as on their first use); not MLA's kv_b_proj, whose dequantized weight the attention multiplies."""
        groups = [v for m in self.modules() for v in vars(m).values() if isinstance(v, RowGroup)]
        fused = [(g, g.fused()) for g in groups]
        replaced = {id(p.weight) for g, f in fused if f is not None for p in g.parts}  # the fused GEMM runs instead
        from .layers.mla import MLA

        replaced |= {id(m.kv_b_proj.weight) for m in self.modules() if isinstance(m, MLA)}  # MLA multiplies it dequantized
        weights = [w for w in self.modules() if isinstance(w, Fp8Block) and id(w) not in replaced]
        weights += [f.weight for _, f in fused if f is not None and isinstance(f.weight, Fp8Block)]
        return {tuple(w.shape) for w in weights if w.act is not None}

    def prepare_kernels(self, workers: int = 8) -> list[str]:
        """Compile ahead the DeepGEMM kernels ``auto`` will run for this model's GEMMs (a server's warm-up:
        otherwise the first batch of each size range waits about 4-5 s per kernel for nvcc).  Nothing where
        ``gemm_fp8_block`` is not asked for ``auto`` or DeepGEMM is not available.  The failed builds'
        messages (Triton runs for those)."""
        from ..kernels.gemm import deepgemm, select

        ops = getattr(self, "ops", None)  # set by the loader
        if self.device.type != "cuda" or ops is None or ops.want("gemm_fp8_block") != "auto":
            return []
        return deepgemm.prebuild(select.deepgemm_jobs(self.gemm_shapes(), self.device), workers)
