"""Shared layers against transformers' own modules and functions, on many random tokens:
the three routing rules, RoPE frequencies and scales (YaRN with and without truncation and
mscale, legacy ``rope_scaling`` keys), and attention with sinks and a sliding window."""

from __future__ import annotations

import pytest
import torch

from quantkit.engine.layers.attention import attend
from quantkit.engine.layers.moe import Router, Routing
from quantkit.engine.layers.rope import Rope, inv_freq_and_scale, mla_softmax_scale, rope_parameters

T = 96  # tokens


def _hf_router(kind: str, **kw):
    import transformers
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    from transformers.models.gpt_oss import modeling_gpt_oss as go
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qm

    cls = {"gpt-oss": (transformers.GptOssConfig, go.GptOssTopKRouter),
           "qwen3-moe": (transformers.Qwen3MoeConfig, qm.Qwen3MoeTopKRouter),
           "deepseek-v3": (transformers.DeepseekV3Config, ds.DeepseekV3TopkRouter)}[kind]
    return cls[1](cls[0](hidden_size=32, **kw))


ROUTERS = [
    ("gpt-oss", dict(num_local_experts=8, num_experts_per_tok=4), Routing("topk_softmax", 4)),
    ("qwen3-moe", dict(num_experts=16, num_experts_per_tok=4, norm_topk_prob=True), Routing("softmax_topk", 4, True)),
    ("qwen3-moe", dict(num_experts=16, num_experts_per_tok=3, norm_topk_prob=False), Routing("softmax_topk", 3, False)),
    ("deepseek-v3", dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5),
     Routing("grouped_sigmoid", 4, True, 4, 2, 2.5)),
]


@pytest.mark.parametrize(("kind", "kw", "routing"), ROUTERS, ids=[f"{r[0]}-{i}" for i, r in enumerate(ROUTERS)])
def test_routing_matches_transformers(gen: torch.Generator, kind: str, kw: dict, routing: Routing) -> None:
    ref = _hf_router(kind, **kw)
    e = ref.weight.shape[0]
    with torch.no_grad():
        ref.weight.copy_(torch.randn(e, 32, generator=gen))
        bias = None
        if kind == "gpt-oss":
            bias = torch.randn(e, generator=gen)
            ref.bias.copy_(bias)
        corr = torch.randn(e, generator=gen) if kind == "deepseek-v3" else None
        if corr is not None:  # large enough to change choices, never the weights
            ref.e_score_correction_bias.copy_(corr)
        x = torch.randn(T, 32, generator=gen)
        _, w_ref, i_ref = ref(x)
    w, i = Router(ref.weight.detach(), routing, bias, corr)(x)
    order, order_ref = i.sort(-1), i_ref.sort(-1)
    assert torch.equal(order.values, order_ref.values)
    torch.testing.assert_close(w.gather(1, order.indices), w_ref.float().gather(1, order_ref.indices), rtol=0, atol=0)


YARN_CONFIGS = [
    # GPT-OSS: YaRN factor 32, truncate false, concentration 0.1 ln 32 + 1 on cos/sin
    ("GptOssConfig", dict(head_dim=64, rope_parameters=None), 150000.0, 64),
    # DeepSeek-V3 as upstream config.json spells it (legacy rope_scaling, "type")
    ("DeepseekV3Config", dict(qk_rope_head_dim=64, max_position_embeddings=163840, rope_scaling=dict(
        type="yarn", factor=40, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0,
        original_max_position_embeddings=4096), rope_theta=10000), 10000.0, 64),
    ("DeepseekV3Config", dict(qk_rope_head_dim=32, rope_parameters=dict(
        rope_type="yarn", rope_theta=5000.0, factor=8.0, mscale=0.707, mscale_all_dim=1.0,
        original_max_position_embeddings=512)), 10000.0, 32),
    ("Qwen3Config", dict(head_dim=32), 10000.0, 32),
]


@pytest.mark.parametrize(("cls", "kw", "theta", "dim"), YARN_CONFIGS, ids=["gpt-oss", "deepseek-legacy", "deepseek-mscale", "default"])
def test_rope_frequencies_match_transformers(cls: str, kw: dict, theta: float, dim: int) -> None:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    hf = getattr(transformers, cls)(**kw)
    raw = {k: v for k, v in kw.items() if k != "rope_parameters" or v is not None}
    if cls == "GptOssConfig":
        raw["rope_parameters"] = hf.rope_parameters  # the class default (config.json carries it)
    p = rope_parameters(raw, theta)
    rope_type = hf.rope_parameters["rope_type"]
    if rope_type == "default":
        ref_inv, ref_scale = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    else:
        ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[rope_type](hf)
    inv, scale = inv_freq_and_scale(p, dim)
    assert torch.equal(inv, ref_inv) and scale == ref_scale
    if cls == "DeepseekV3Config":
        assert mla_softmax_scale(p, 192) == yarn_apply_mscale(hf.rope_parameters, 192**-0.5)


def test_interleaved_rope_equals_deepseek_complex_rotation(gen: torch.Generator) -> None:
    """DeepSeek's reference: view_as_complex pairs (x[2i], x[2i+1]) times e^{i pos f}; ours writes
    rotated evens then odds (transformers' layout), a permutation that preserves every q.k."""
    rope = Rope(16, {"rope_type": "default", "rope_theta": 10000.0}, "interleaved")
    x, pos = torch.randn(5, 3, 16, generator=gen), torch.arange(5) * 7
    z = torch.view_as_complex(x.reshape(5, 3, 8, 2)) * torch.polar(torch.ones(5, 1, 8), pos[:, None, None] * rope.inv_freq)
    ref = torch.view_as_real(z).flatten(-2)
    ours = rope(x, pos)
    torch.testing.assert_close(ours, torch.cat((ref[..., 0::2], ref[..., 1::2]), -1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [None, 3])
def test_sink_attention_matches_transformers_eager(gen: torch.Generator, window: int | None) -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    n, hq, hkv, d = 9, 4, 2, 8
    q, k, v = torch.randn(n, hq, d, generator=gen), torch.randn(n, hkv, d, generator=gen), torch.randn(n, hkv, d, generator=gen)
    sinks = torch.randn(hq, generator=gen)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    allowed = (j <= i) & ((j > i - window) if window else True)
    mask = torch.zeros(n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    module.num_key_value_groups, module.sinks, module.training = hq // hkv, sinks, False
    ref, _ = eager_attention_forward(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, 0.35)
    ours = attend(q, k, v, torch.arange(n), torch.arange(n), 0.35, sinks, window)
    torch.testing.assert_close(ours, ref[0], rtol=1e-6, atol=1e-6)
