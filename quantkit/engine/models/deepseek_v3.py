"""DeepSeek-V3 / R1 / V3.1 (transformers models/deepseek_v3, DeepSeek inference/model.py): MLA
attention with YaRN (mscale on the softmax scale), dense SwiGLU MLP on the first
``first_k_dense_replace`` layers, then MoE with grouped sigmoid routing (correction bias for the
choice only, routed_scaling_factor) plus the shared expert.

RoPE pairs: DeepSeek's reference rotates interleaved pairs; transformers does the same when
``rope_interleave`` is true (its default, and what checkpoints without the key get) and
half-split pairs otherwise.  We follow transformers.

The multi-token-prediction layer ``model.layers.{num_hidden_layers}`` (enorm, hnorm, eh_proj, a
full decoder layer, shared_head.norm / shared_head.head, its own embed_tokens) is loaded when
present, as :class:`MTP`; it predicts token t+2 from the main model's final-normed hidden state at
t and the embedding of token t+1 (transformers ``MtpLayer``, vLLM ``DeepSeekMTP``).
"""

from __future__ import annotations

import torch
from torch import nn

from ...modelconfig import ModelConfig
from ..batch import Batch
from ..kv_cache import KVCache
from ..layers.mla import MLA
from ..layers.mlp import MLP
from ..layers.moe import Experts, MoE, Router, Routing
from ..layers.norm import RMSNorm
from ..layers.rope import Rope, mla_softmax_scale, rope_parameters
from ..model import CausalLM, DecoderLayer
from ..qlinear import Linear
from ..weights import Weights, setting

LORA_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: default eps in both references, not rms_norm_eps


def _attn(mc: ModelConfig, w: Weights, a: str, i: int, rope: Rope) -> MLA:
    m = mc.mla
    assert m is not None
    nope, rdim = m.nope, m.rope
    lora = m.q_lora is not None
    return MLA(
        i,
        q_proj=None if lora else w.linear(a + "q_proj"),
        q_a_proj=w.linear(a + "q_a_proj") if lora else None,
        q_a_norm=w.norm(a + "q_a_layernorm.weight", LORA_NORM_EPS) if lora else None,
        q_b_proj=w.linear(a + "q_b_proj") if lora else None,
        kv_a_proj=w.linear(a + "kv_a_proj_with_mqa"),
        kv_a_norm=w.norm(a + "kv_a_layernorm.weight", LORA_NORM_EPS),
        kv_b_proj=w.linear(a + "kv_b_proj"),
        o_proj=w.linear(a + "o_proj"),
        rope=rope,
        num_heads=mc.heads,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rdim,
        v_head_dim=m.v,
        kv_lora_rank=m.kv_lora,
        scale=mla_softmax_scale(rope_parameters(mc.raw), nope + rdim),
        ops=w.ops,
    )


def _mlp(w: Weights, p: str) -> MLP:
    return MLP(*(w.linear(p + f"{x}_proj") for x in ("gate", "up", "down")))


def _moe(mc: ModelConfig, w: Weights, p: str) -> MoE:
    cfg = mc.raw
    if setting(cfg, "scoring_func", default="sigmoid") != "sigmoid":
        raise ValueError(f"DeepSeek scoring_func {cfg['scoring_func']!r} is not supported (sigmoid)")
    e = [f"{p}experts.{j}." for j in w.expert_ids(p, mc.experts)]
    experts = Experts(
        w.stacked([x + "down_proj" for x in e]),
        gate=w.stacked([x + "gate_proj" for x in e]),
        up=w.stacked([x + "up_proj" for x in e]),
    )
    routing = Routing(
        "grouped_sigmoid",
        mc.top_k,
        bool(setting(cfg, "norm_topk_prob", default=True)),
        setting(cfg, "n_group", default=1),
        setting(cfg, "topk_group", default=1),
        float(setting(cfg, "routed_scaling_factor", default=1.0)),
    )
    router = Router(w.raw(p + "gate.weight"), routing, correction_bias=w.opt(p + "gate.e_score_correction_bias", torch.float32))
    shared = _mlp(w, p + "shared_experts.") if mc.shared_experts else None
    return MoE(router, experts, shared)


def _layer(mc: ModelConfig, w: Weights, i: int, rope: Rope) -> DecoderLayer:
    p = f"model.layers.{i}."
    eps = setting(mc.raw, "rms_norm_eps", default=1e-6)
    mlp = _moe(mc, w, p + "mlp.") if mc.sparse[i] else _mlp(w, p + "mlp.")
    norms = (w.norm(p + "input_layernorm.weight", eps), w.norm(p + "post_attention_layernorm.weight", eps))
    return DecoderLayer(_attn(mc, w, p + "self_attn.", i, rope), mlp, *norms)


class MTP(nn.Module):
    def __init__(self, embed: torch.Tensor, enorm: RMSNorm, hnorm: RMSNorm, eh_proj: Linear, block: DecoderLayer, norm: RMSNorm, head: Linear) -> None:
        super().__init__()
        self.register_buffer("embed_tokens", embed)
        self.enorm, self.hnorm, self.eh_proj, self.block, self.norm, self.head = enorm, hnorm, eh_proj, block, norm, head

    def forward(self, input_ids: torch.Tensor, prev_hidden: torch.Tensor, batch: Batch, cache: KVCache | None = None) -> torch.Tensor:
        """Logits float32 [T, vocab] for the token after ``input_ids`` (each row: embedding of token t+1, hidden of t)."""
        batch.check(input_ids)
        x = torch.cat((self.enorm(self.embed_tokens[input_ids]), self.hnorm(prev_hidden)), dim=-1)
        h = self.block(self.eh_proj(x), batch, cache)
        return self.head(self.norm(h)).to(torch.float32)


def _mtp(mc: ModelConfig, w: Weights, rope: Rope, main_embed: torch.Tensor, main_head: Linear) -> MTP | None:
    n = mc.layers
    p = f"model.layers.{n}."
    if not w.has_linear(p + "eh_proj"):
        return None
    eps = setting(mc.raw, "rms_norm_eps", default=1e-6)
    embed = w.get(p + "embed_tokens.weight") if w.has(p + "embed_tokens.weight") else main_embed
    head = w.linear(p + "shared_head.head") if w.has_linear(p + "shared_head.head") else main_head
    return MTP(
        embed, w.norm(p + "enorm.weight", eps), w.norm(p + "hnorm.weight", eps), w.linear(p + "eh_proj"),
        _layer(mc, w, n, rope), w.norm(p + "shared_head.norm.weight", eps), head,
    )


def build(mc: ModelConfig, w: Weights) -> CausalLM:
    cfg = mc.raw
    style = "interleaved" if setting(cfg, "rope_interleave", default=True) else "half"
    rope = Rope(mc.head_dim, rope_parameters(cfg), style)
    layers = [_layer(mc, w, i, rope) for i in range(mc.layers)]
    embed, head = w.get("model.embed_tokens.weight"), w.lm_head(cfg)
    norm = w.norm("model.norm.weight", setting(cfg, "rms_norm_eps", default=1e-6))
    return CausalLM("deepseek-v3", cfg, embed, layers, norm, head, w.dtype, mtp=_mtp(mc, w, rope, embed, head))
