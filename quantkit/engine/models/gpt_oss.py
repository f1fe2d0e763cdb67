"""GPT-OSS (transformers models/gpt_oss, openai/gpt-oss torch/model.py): GQA attention with biases,
per-head sinks and a 128-token sliding window on "sliding_attention" layers (even layers), YaRN RoPE
(half-split, concentration 0.1 ln(32) + 1), MoE of fused interleaved gate_up experts with biases
and the clamped SwiGLU, router top-k then softmax.  Norms multiply in float32."""

from __future__ import annotations

import torch

from ...modelconfig import ModelConfig
from ..layers.attention import Attention
from ..layers.moe import Experts, MoE, Router, Routing
from ..layers.rope import Rope, rope_parameters
from ..model import CausalLM, DecoderLayer
from ..weights import Weights, setting

DEFAULT_THETA = 150000.0


def _layer_types(cfg: dict, n: int) -> list[str]:
    return cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


def _moe(mc: ModelConfig, w: Weights, p: str) -> MoE:
    cfg = mc.raw
    e = p + "mlp.experts."
    experts = Experts(
        w.fused(e + "down_proj"),
        gate_up=w.fused(e + "gate_up_proj"),
        gate_up_bias=w.raw(e + "gate_up_proj_bias"),
        down_bias=w.raw(e + "down_proj_bias"),
        activation="gpt-oss",
        alpha=setting(cfg, "swiglu_alpha", default=1.702),
        limit=setting(cfg, "swiglu_limit", default=7.0),
    )
    routing = Routing("topk_softmax", mc.top_k)
    router = Router(w.raw(p + "mlp.router.weight"), routing, bias=w.raw(p + "mlp.router.bias"))
    return MoE(router, experts)


def build(mc: ModelConfig, w: Weights) -> CausalLM:
    cfg, n_layers = mc.raw, mc.layers
    heads, kv_heads, head_dim = mc.heads, mc.kv_heads, mc.head_dim
    eps = setting(cfg, "rms_norm_eps", default=1e-5)
    rope = Rope(head_dim, rope_parameters(cfg, DEFAULT_THETA), "half")
    types, window = _layer_types(cfg, n_layers), setting(cfg, "sliding_window", default=None)
    bias = mc.attention_bias
    layers = []
    for i in range(n_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        attn = Attention(
            i, *(w.linear(a + f"{x}_proj", bias=bias) for x in "qkvo"),
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rope=rope,
            sinks=w.get(a + "sinks", torch.float32),
            window=window if types[i] == "sliding_attention" else None,
            ops=w.ops,
        )
        norms = (w.norm(p + "input_layernorm.weight", eps, "f32"), w.norm(p + "post_attention_layernorm.weight", eps, "f32"))
        layers.append(DecoderLayer(attn, _moe(mc, w, p), *norms))
    embed = w.get("model.embed_tokens.weight")
    return CausalLM("gpt-oss", cfg, embed, layers, w.norm("model.norm.weight", eps, "f32"), w.lm_head(cfg), w.dtype)
