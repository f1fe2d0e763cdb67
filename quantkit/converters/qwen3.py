"""Qwen3 and Qwen3-MoE (transformers models/qwen3, qwen3_moe): names are kept exactly.

Per layer ``model.layers.{i}.``:
  input_layernorm.weight [H], post_attention_layernorm.weight [H]
  self_attn.{q,k,v,o}_proj.weight  q [heads*hd, H], k/v [kv_heads*hd, H], o [H, heads*hd]
                                   (+ .bias when attention_bias)
  self_attn.{q,k}_norm.weight [hd]
  dense MLP: mlp.{gate,up}_proj.weight [I, H], mlp.down_proj.weight [H, I]
  MoE layer: mlp.gate.weight [E, H] (router, no bias),
             mlp.experts.{e}.{gate,up}_proj.weight [Im, H], mlp.experts.{e}.down_proj.weight [H, Im]
  A layer is MoE when num_experts > 0, it is not in mlp_only_layers and (i+1) % decoder_sparse_step == 0.
Top level: model.embed_tokens.weight [V, H], model.norm.weight [H], lm_head.weight [V, H]
(absent when tie_word_embeddings).  The shapes come from :mod:`quantkit.modelshapes` (the config as
:mod:`quantkit.modelconfig` reads it); any other config field passes through.
Qwen's own FP8 releases store the same names with F8_E4M3 weights and ``weight_scale_inv``.
"""

from __future__ import annotations

from .kept import build

__all__ = ["build"]  # both families' converter: names kept (quantkit.families.qwen3)
