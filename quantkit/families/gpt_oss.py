"""GPT-OSS (20b, 120b; transformers models/gpt_oss, openai/gpt-oss): sink attention with alternating sliding windows,
fused interleaved MXFP4 experts with biases.  Layout and numerics: REFERENCE.md "GPT-OSS"; the converter reads both
the HF root names and OpenAI's ``original/`` layout.

Synth presets: ``tiny`` (a few MB, every dimension a multiple of 128), ``tiny-ragged`` (the real models' ragged
shapes in miniature: 2880 = 22.5 x 128 becomes 320 / 192), and the released models' shapes and vocabulary.
"""

from __future__ import annotations

from .registry import Arch, Family, register
from .splits import LAYER, NORMS, QKVO, VOCAB, Rule

PRESETS: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=256, intermediate=256, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=4,
                 vocab=2048, tok_base=1984, sliding_window=32),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=192, heads=5, kv_heads=1, head_dim=64, experts=4, top_k=2,
                        vocab=2048, tok_base=1984, sliding_window=32),
    "gpt-oss-20b": dict(layers=24, hidden=2880, intermediate=2880, heads=64, kv_heads=8, head_dim=64, experts=32, top_k=4,
                        vocab=201088, tok_base=199998, sliding_window=128),
    "gpt-oss-120b": dict(layers=36, hidden=2880, intermediate=2880, heads=64, kv_heads=8, head_dim=64, experts=128, top_k=4,
                         vocab=201088, tok_base=199998, sliding_window=128),
}

register(Family(
    "gpt-oss", ("GptOssForCausalLM",),
    quantized=(LAYER + r"self_attn\.(q|k|v|o)_proj\.weight", LAYER + r"mlp\.experts\.(gate_up|down)_proj"),
    fused_experts=True,
    arch=Arch(
        keys=(("experts", ("num_local_experts", "num_experts")),  # openai's original/ config says num_experts
              ("top_k", ("num_experts_per_tok", "experts_per_token"))),
        head_dim=64, kv_heads_required=True, attention_bias=True, experts_use_intermediate=True, sinks=True,
    ),
    converter="quantkit.converters.gpt_oss:build",
    engine="quantkit.engine.models.gpt_oss:build",
    shard=(
        *VOCAB, *NORMS, *QKVO,
        Rule(LAYER + r"self_attn\.sinks", "column", "heads"),  # one sink logit per q head
        Rule(LAYER + r"mlp\.router", "replicate"),
        Rule(LAYER + r"mlp\.experts\.(gate_up|down)_proj", "fused"),
    ),
    synth="quantkit.synth.gpt_oss:build",
    presets=PRESETS,
))
