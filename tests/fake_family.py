"""A model family declared in this one file, for tests/test_extension_points.py: ``toy-lm``, Qwen3's dense
architecture under its own architecture name (``ToyLmForCausalLM``), with its own synth preset and split rules.
It points to Qwen3's converter (names kept) and engine model file, and builds its synthetic checkpoints with Qwen3's
synth under its own name.

Loading this module registers the family; nothing else in quantkit names it.
"""

from __future__ import annotations

import dataclasses

from quantkit.families import Arch, Family, register
from quantkit.families.splits import DENSE_MLP, LAYER, NORMS, QKVO, VOCAB, Rule
from quantkit.synth.pieces import Synth

ARCHITECTURE = "ToyLmForCausalLM"
TINY = dict(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=2048, tok_base=1920, max_positions=40960)


def synth(d: dict, seed: int, layout: str, scale_fmt: str) -> Synth:
    """Qwen3's synthetic checkpoint, config.json naming this family."""
    from quantkit.synth import qwen3

    s = qwen3.build_dense(d, seed, layout, scale_fmt)
    return dataclasses.replace(s, config={**s.config, "architectures": [ARCHITECTURE], "model_type": "toy_lm"})


register(Family(
    "toy-lm", (ARCHITECTURE,),
    quantized=(LAYER + r"self_attn\.(q|k|v|o)_proj\.weight", LAYER + r"mlp\.(gate|up|down)_proj\.weight"),
    fused_experts=False,
    arch=Arch(moe=False, head_dim=64),
    converter="quantkit.converters.qwen3:build",
    engine="quantkit.engine.models.qwen3:build",
    shard=(*VOCAB, *NORMS, *QKVO, Rule(LAYER + r"self_attn\.(q|k)_norm", "replicate"), *DENSE_MLP),
    synth=synth,
    presets={"tiny": TINY},
))
