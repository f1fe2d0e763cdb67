"""Qwen3 and Qwen3-MoE (transformers models/qwen3, qwen3_moe): GQA attention without biases and
with per-head RMSNorm of q and k before RoPE (half-split); dense SwiGLU MLP, or on sparse layers
(not in ``mlp_only_layers``, every ``decoder_sparse_step``-th) a router softmax -> top-k ->
renormalise-if-norm_topk_prob over per-expert SwiGLU experts, no shared expert."""

from __future__ import annotations

from torch import nn

from ..layers.attention import Attention
from ..layers.mlp import MLP
from ..layers.moe import Experts, MoE, Router, Routing
from ..layers.rope import Rope, rope_parameters
from ..model import CausalLM, DecoderLayer
from ..weights import Weights, setting


def _window(cfg: dict, i: int, moe: bool) -> int | None:
    """transformers: sliding_window applies only with use_sliding_window; Qwen3 dense then per layer_types."""
    window = setting(cfg, "sliding_window", default=None) if cfg.get("use_sliding_window") else None
    if window is None or moe:
        return window
    types = cfg.get("layer_types") or [
        "sliding_attention" if i >= setting(cfg, "max_window_layers", default=28) else "full_attention"
        for i in range(setting(cfg, "num_hidden_layers"))
    ]
    return window if types[i] == "sliding_attention" else None


def _mlp(w: Weights, p: str) -> MLP:
    return MLP(*(w.linear(p + f"{x}_proj") for x in ("gate", "up", "down")))


def _moe(cfg: dict, w: Weights, p: str, n_experts: int) -> MoE:
    e = [f"{p}experts.{j}." for j in w.expert_ids(p, n_experts)]
    experts = Experts(
        w.stacked([x + "down_proj" for x in e]),
        gate=w.stacked([x + "gate_proj" for x in e]),
        up=w.stacked([x + "up_proj" for x in e]),
    )
    routing = Routing("softmax_topk", setting(cfg, "num_experts_per_tok"), bool(setting(cfg, "norm_topk_prob", default=False)))
    return MoE(Router(w.raw(p + "gate.weight"), routing), experts)


def _is_sparse(cfg: dict, i: int, n_experts: int) -> bool:
    step = setting(cfg, "decoder_sparse_step", default=1)
    return n_experts > 0 and i not in (cfg.get("mlp_only_layers") or []) and (i + 1) % step == 0


def build(cfg: dict, w: Weights) -> CausalLM:
    moe = "Qwen3MoeForCausalLM" in (cfg.get("architectures") or [])
    n_experts = setting(cfg, "num_experts", "num_local_experts", default=0) if moe else 0
    heads, kv_heads = setting(cfg, "num_attention_heads"), setting(cfg, "num_key_value_heads")
    head_dim = setting(cfg, "head_dim", default=setting(cfg, "hidden_size") // heads)
    eps = setting(cfg, "rms_norm_eps", default=1e-6)
    rope = Rope(head_dim, rope_parameters(cfg), "half")
    layers = []
    for i in range(setting(cfg, "num_hidden_layers")):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        attn = Attention(
            i, *(w.linear(a + f"{x}_proj", bias=bool(cfg.get("attention_bias"))) for x in "qkvo"),
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rope=rope,
            window=_window(cfg, i, moe), q_norm=w.norm(a + "q_norm.weight", eps), k_norm=w.norm(a + "k_norm.weight", eps),
            ops=w.ops,
        )
        mlp: nn.Module = _moe(cfg, w, p + "mlp.", n_experts) if _is_sparse(cfg, i, n_experts) else _mlp(w, p + "mlp.")
        norms = (w.norm(p + "input_layernorm.weight", eps), w.norm(p + "post_attention_layernorm.weight", eps))
        layers.append(DecoderLayer(attn, mlp, *norms))
    family = "qwen3-moe" if moe else "qwen3"
    embed = w.get("model.embed_tokens.weight")
    return CausalLM(family, cfg, embed, layers, w.norm("model.norm.weight", eps), w.lm_head(cfg), w.dtype)
