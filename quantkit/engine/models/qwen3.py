"""Qwen3 and Qwen3-MoE (transformers models/qwen3, qwen3_moe): GQA attention without biases and
with per-head RMSNorm of q and k before RoPE (half-split); dense SwiGLU MLP, or on sparse layers
(not in ``mlp_only_layers``, every ``decoder_sparse_step``-th) a router softmax -> top-k ->
renormalise-if-norm_topk_prob over per-expert SwiGLU experts, no shared expert."""

from __future__ import annotations

from torch import nn

from ...modelconfig import ModelConfig
from ..layers.attention import Attention
from ..layers.mlp import MLP
from ..layers.moe import Experts, MoE, Router, Routing
from ..layers.rope import Rope, rope_parameters
from ..model import CausalLM, DecoderLayer
from ..weights import Weights, setting


def _window(mc: ModelConfig, i: int) -> int | None:
    """transformers: sliding_window applies only with use_sliding_window; Qwen3 dense then per layer_types."""
    cfg = mc.raw
    window = setting(cfg, "sliding_window", default=None) if cfg.get("use_sliding_window") else None
    if window is None or mc.family == "qwen3-moe":
        return window
    types = cfg.get("layer_types") or [
        "sliding_attention" if j >= setting(cfg, "max_window_layers", default=28) else "full_attention" for j in range(mc.layers)
    ]
    return window if types[i] == "sliding_attention" else None


def _mlp(w: Weights, p: str) -> MLP:
    return MLP(*(w.linear(p + f"{x}_proj") for x in ("gate", "up", "down")))


def _moe(mc: ModelConfig, w: Weights, p: str) -> MoE:
    e = [f"{p}experts.{j}." for j in w.expert_ids(p, mc.experts)]
    experts = Experts(
        w.stacked([x + "down_proj" for x in e]),
        gate=w.stacked([x + "gate_proj" for x in e]),
        up=w.stacked([x + "up_proj" for x in e]),
    )
    routing = Routing("softmax_topk", mc.top_k, bool(setting(mc.raw, "norm_topk_prob", default=False)))
    return MoE(Router(w.raw(p + "gate.weight"), routing), experts)


def build(mc: ModelConfig, w: Weights) -> CausalLM:
    eps = setting(mc.raw, "rms_norm_eps", default=1e-6)
    rope = Rope(mc.head_dim, rope_parameters(mc.raw), "half")
    layers = []
    for i in range(mc.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        attn = Attention(
            i, *(w.linear(a + f"{x}_proj", bias=mc.attention_bias) for x in "qkvo"),
            num_heads=mc.heads, num_kv_heads=mc.kv_heads, head_dim=mc.head_dim, rope=rope,
            window=_window(mc, i), q_norm=w.norm(a + "q_norm.weight", eps), k_norm=w.norm(a + "k_norm.weight", eps),
            ops=w.ops,
        )
        mlp: nn.Module = _moe(mc, w, p + "mlp.") if mc.sparse[i] else _mlp(w, p + "mlp.")
        norms = (w.norm(p + "input_layernorm.weight", eps), w.norm(p + "post_attention_layernorm.weight", eps))
        layers.append(DecoderLayer(attn, mlp, *norms))
    embed = w.get("model.embed_tokens.weight")
    return CausalLM(mc.family, mc.raw, embed, layers, w.norm("model.norm.weight", eps), w.lm_head(mc.raw), w.dtype)
