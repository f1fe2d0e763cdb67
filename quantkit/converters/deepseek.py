"""DeepSeek-V3 / R1 / V3.1 (HF repo layout, README_WEIGHTS.md; transformers models/deepseek_v3): names kept exactly.

Per layer ``model.layers.{i}.`` (MLA attention):
  input_layernorm.weight [H], post_attention_layernorm.weight [H]
  self_attn.q_a_proj.weight [q_lora, H], self_attn.q_a_layernorm.weight [q_lora],
  self_attn.q_b_proj.weight [heads*(nope+rope), q_lora]    (q_proj [heads*(nope+rope), H] when q_lora_rank is null)
  self_attn.kv_a_proj_with_mqa.weight [kv_lora+rope, H], self_attn.kv_a_layernorm.weight [kv_lora]
  self_attn.kv_b_proj.weight [heads*(nope+v), kv_lora], self_attn.o_proj.weight [H, heads*v]
  dense (i < first_k_dense_replace): mlp.{gate,up}_proj.weight [I, H], mlp.down_proj.weight [H, I]
  MoE: mlp.gate.weight [E, H] (BF16 router), mlp.gate.e_score_correction_bias [E] (F32, noaux_tc),
       mlp.experts.{e}.{gate,up}_proj.weight [Im, H], mlp.experts.{e}.down_proj.weight [H, Im],
       mlp.shared_experts.{gate,up}_proj.weight [Im*n_shared, H], mlp.shared_experts.down_proj.weight [H, Im*n_shared]
MTP layers ``model.layers.{L+j}`` for j < num_nextn_predict_layers (kept, not dropped): a full MoE
decoder layer plus enorm.weight [H], hnorm.weight [H], eh_proj.weight [H, 2H] (BF16 upstream),
embed_tokens.weight [V, H], shared_head.norm.weight [H], shared_head.head.weight [V, H].
Top level: model.embed_tokens.weight, model.norm.weight, lm_head.weight.
Every projection is F8_E4M3 with ``weight_scale_inv`` [ceil(N/128), ceil(K/128)] in the official release.
The shapes come from :mod:`quantkit.modelshapes` (the config as :mod:`quantkit.modelconfig` reads it).
"""

from __future__ import annotations

from .kept import build

__all__ = ["build"]  # the family's converter: names kept (quantkit.families.deepseek_v3)
