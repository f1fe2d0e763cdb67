"""DeepSeek-V3 / R1 / V3.1 (HF repo layout, README_WEIGHTS.md; transformers models/deepseek_v3): MLA attention,
grouped sigmoid routing with e_score_correction_bias, a shared expert, dense first layers, MTP layers; FP8 128x128
blocks (V3.1: power-of-two scales).  Layout and numerics: REFERENCE.md "DeepSeek-V3".

Synth presets: ``tiny`` (kv_lora_rank 128 + qk_rope_head_dim 128 keeps kv_a_proj_with_mqa whole-tile), ``tiny-ragged``
(DeepSeek's 576-row kv_a_proj_with_mqa in miniature: partial 128-tiles), ``tiny-e16`` (16 experts over 4 groups:
expert parallelism at EP 16 in tests), and the released model's shapes and vocabulary.
"""

from __future__ import annotations

from .registry import Arch, Family, register
from .splits import DENSE_MLP, LAYER, NORMS, VOCAB, Rule

PRESETS: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=256, intermediate=512, moe_intermediate=128, heads=4, q_lora=128, kv_lora=128,
                 qk_nope=64, qk_rope=128, v_head=128, experts=8, shared=1, top_k=2, n_group=4, topk_group=2,
                 first_dense=1, vocab=2048, tok_base=1920, tok_reserved=8),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=448, moe_intermediate=192, heads=2, q_lora=192, kv_lora=160,
                        qk_nope=64, qk_rope=32, v_head=64, experts=8, shared=1, top_k=2, n_group=4, topk_group=2,
                        first_dense=1, vocab=2048, tok_base=1920, tok_reserved=8),
    "tiny-e16": dict(layers=2, hidden=256, intermediate=512, moe_intermediate=128, heads=4, q_lora=128, kv_lora=128,
                     qk_nope=64, qk_rope=128, v_head=128, experts=16, shared=1, top_k=4, n_group=4, topk_group=2,
                     first_dense=1, vocab=2048, tok_base=1920, tok_reserved=8),
    "deepseek-v3": dict(layers=61, hidden=7168, intermediate=18432, moe_intermediate=2048, heads=128, q_lora=1536,
                        kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, experts=256, shared=1, top_k=8, n_group=8,
                        topk_group=4, first_dense=3, vocab=129280, tok_base=128000, tok_reserved=798),
}

register(Family(
    "deepseek-v3", ("DeepseekV3ForCausalLM",),
    quantized=(
        LAYER + r"self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)\.weight",
        LAYER + r"mlp\.(shared_experts\.|experts\.\d+\.)?(gate|up|down)_proj\.weight",
    ),
    fused_experts=False,
    arch=Arch(
        keys=(("experts", ("n_routed_experts", "num_local_experts")),  # 5.x: num_local_experts -> n_routed_experts
              ("mtp_layers", ("num_nextn_predict_layers", "num_mtp_layers"))),
        sparse="first_dense", mla=True, shared_experts=True, grouped_routing=True,
    ),
    converter="quantkit.converters.deepseek:build",
    engine="quantkit.engine.models.deepseek_v3:build",
    # DeepSeek-V3 inference/convert.py: embed/head/wq/wq_b/wkv_b/w1/w3 dim 0, wo/w2 dim 1, the rest
    # (wq_a, wkv_a, their norms, the router and its bias) replicated; experts given contiguously.
    shard=(
        *VOCAB, *NORMS,
        Rule(LAYER + r"self_attn\.(q_proj|q_b_proj|kv_b_proj)", "column", "heads"),
        Rule(LAYER + r"self_attn\.(q_a_proj|kv_a_proj_with_mqa|q_a_layernorm|kv_a_layernorm)", "replicate"),
        Rule(LAYER + r"self_attn\.o_proj", "row", "heads"),
        Rule(LAYER + r"mlp\.gate", "replicate"),  # router weight and e_score_correction_bias
        Rule(LAYER + r"mlp\.experts\.\d+\.(gate|up|down)_proj", "expert"),
        Rule(LAYER + r"mlp\.shared_experts\.(gate|up)_proj", "column"),
        Rule(LAYER + r"mlp\.shared_experts\.down_proj", "row"),
        *DENSE_MLP,
        # MTP layer (model.layers.61): its embedding and head split like embed_tokens / lm_head
        Rule(LAYER + r"(enorm|hnorm|eh_proj|shared_head\.norm)", "replicate"),
        Rule(LAYER + r"(embed_tokens|shared_head\.head)", "column"),
    ),
    synth="quantkit.synth.deepseek:build",
    presets=PRESETS,
))
