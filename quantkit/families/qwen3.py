"""Qwen3 and Qwen3-MoE (transformers models/qwen3, qwen3_moe), BF16 as fine-tunes ship them (also Qwen's FP8 block
release): GQA attention with q/k norms; Qwen3-MoE's softmax top-k routing over per-expert weights, no shared expert.
Both families share the converter (names kept), the engine model file and the split rules.

Synth presets: ``tiny``, ``tiny-ragged`` (partial 128-tiles) and the released models' shapes and vocabulary
(Qwen3-MoE's tiny has head_dim 128 with hidden 256: the q projection is wider than hidden, as in the 30B-A3B).
"""

from __future__ import annotations

from .registry import Arch, Family, register
from .splits import DENSE_MLP, LAYER, NORMS, QKVO, VOCAB, Rule

QWEN3: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=2048, tok_base=1920,
                 max_positions=40960),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=448, heads=5, kv_heads=1, head_dim=64, vocab=2048,
                        tok_base=1920, max_positions=40960),
    "qwen3-8b": dict(layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                     tok_base=151643, max_positions=40960),
}
QWEN3_MOE: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=128, experts=8, top_k=2,
                 moe_intermediate=128, vocab=2048, tok_base=1920, max_positions=40960),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=448, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=2,
                        moe_intermediate=192, vocab=2048, tok_base=1920, max_positions=40960),
    "qwen3-30b-a3b": dict(layers=48, hidden=2048, intermediate=6144, heads=32, kv_heads=4, head_dim=128, experts=128,
                          top_k=8, moe_intermediate=768, vocab=151936, tok_base=151643, max_positions=40960),
    "qwen3-235b-a22b": dict(layers=94, hidden=4096, intermediate=12288, heads=64, kv_heads=4, head_dim=128, experts=128,
                            top_k=8, moe_intermediate=1536, vocab=151936, tok_base=151643, max_positions=40960),
}

QUANTIZED = (LAYER + r"self_attn\.(q|k|v|o)_proj\.weight", LAYER + r"mlp\.(experts\.\d+\.)?(gate|up|down)_proj\.weight")
SHARD = (
    *VOCAB, *NORMS, *QKVO,
    Rule(LAYER + r"self_attn\.(q|k)_norm", "replicate"),
    Rule(LAYER + r"mlp\.gate", "replicate"),  # the MoE router (no bias); gate_proj is the dense MLP
    Rule(LAYER + r"mlp\.experts\.\d+\.(gate|up|down)_proj", "expert"),
    *DENSE_MLP,
)

register(Family(
    "qwen3", ("Qwen3ForCausalLM",), QUANTIZED, fused_experts=False,
    arch=Arch(moe=False, head_dim=128),
    converter="quantkit.converters.qwen3:build", engine="quantkit.engine.models.qwen3:build", shard=SHARD,
    synth="quantkit.synth.qwen3:build_dense", presets=QWEN3,
))
register(Family(
    "qwen3-moe", ("Qwen3MoeForCausalLM",), QUANTIZED, fused_experts=False,
    arch=Arch(keys=(("experts", ("num_experts", "num_local_experts")),), sparse="step"),  # 5.x: num_experts -> num_local_experts
    converter="quantkit.converters.qwen3:build", engine="quantkit.engine.models.qwen3:build", shard=SHARD,
    synth="quantkit.synth.qwen3:build_moe", presets=QWEN3_MOE,
))
