"""Model families: which config ``architectures`` belong to which family, and which tensors (by HF
root name) are linear projection weights that quantized targets quantize.

Data, not code: each family is one :class:`Family` entry.  What stays in source precision
(DESIGN.md "What gets quantized"): embeddings, lm_head, routers, norms, sinks, biases,
DeepSeek's e_score_correction_bias and its MTP ``eh_proj`` / ``shared_head`` (BF16 upstream,
loaded as plain linears by vLLM and SGLang).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    # regexes over HF root names of *weights* that quantized formats quantize
    quantized: tuple[str, ...]
    # per-expert (DeepSeek/Qwen) or fused [E, ...] (GPT-OSS) routed experts
    fused_experts: bool


_L = r"model\.layers\.\d+\."
FAMILIES: dict[str, Family] = {}


def register(f: Family) -> Family:
    FAMILIES[f.name] = f
    return f


register(Family(
    "gpt-oss", ("GptOssForCausalLM",),
    (_L + r"self_attn\.(q|k|v|o)_proj\.weight", _L + r"mlp\.experts\.(gate_up|down)_proj"),
    fused_experts=True,
))
register(Family(
    "deepseek-v3", ("DeepseekV3ForCausalLM",),
    (
        _L + r"self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)\.weight",
        _L + r"mlp\.(shared_experts\.|experts\.\d+\.)?(gate|up|down)_proj\.weight",
    ),
    fused_experts=False,
))
_QWEN = (
    _L + r"self_attn\.(q|k|v|o)_proj\.weight",
    _L + r"mlp\.(experts\.\d+\.)?(gate|up|down)_proj\.weight",
)
register(Family("qwen3", ("Qwen3ForCausalLM",), _QWEN, fused_experts=False))
register(Family("qwen3-moe", ("Qwen3MoeForCausalLM",), _QWEN, fused_experts=False))


def supported_architectures() -> list[str]:
    return sorted(a for f in FAMILIES.values() for a in f.architectures)


def detect(config: dict, where: str = "config.json") -> Family:
    """The family named by ``config['architectures']``; a clear error otherwise."""
    archs = config.get("architectures") or []
    for f in FAMILIES.values():
        if any(a in f.architectures for a in archs):
            return f
    raise ValueError(
        f"{where}: architectures {archs or 'missing'} is not supported; supported: {', '.join(supported_architectures())}"
    )


def is_quantized_weight(family: Family, name: str) -> bool:
    """True for a linear projection weight (root name, without scale suffixes) that targets quantize."""
    return any(re.fullmatch(p, name) for p in family.quantized)
