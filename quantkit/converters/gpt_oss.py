"""GPT-OSS 20b / 120b (transformers models/gpt_oss + integrations/mxfp4.py, openai/gpt-oss): output
always uses the HF root names, also from an ``original/`` source.

HF root layout per layer ``model.layers.{i}.``:
  input_layernorm.weight [H], post_attention_layernorm.weight [H]
  self_attn.{q,k,v}_proj.{weight,bias} q [heads*hd, H], k/v [kv*hd, H]; self_attn.o_proj.{weight [H, heads*hd], bias [H]}
  self_attn.sinks [heads]; mlp.router.{weight [E, H], bias [E]}
  mlp.experts.gate_up_proj_blocks U8 [E, 2I, H/32, 16] + _scales U8 [E, 2I, H/32], gate_up_proj_bias [E, 2I]
  mlp.experts.down_proj_blocks U8 [E, H, I/32, 16] + _scales U8 [E, H, I/32], down_proj_bias [E, H]
  (BF16 as transformers saves it: mlp.experts.gate_up_proj [E, H, 2I], down_proj [E, I, H])
Top level: model.embed_tokens.weight [V, H], model.norm.weight [H], lm_head.weight [V, H].
gate_up rows are INTERLEAVED (row 2k gate, 2k+1 up); every layout here keeps that order.

``original/`` names (the rename table below, as transformers' convert_gpt_oss_weights_to_hf.py):
``block.{i}.attn.qkv`` holds q|k|v rows and is split; MXFP4 tensors are identical, only renamed.
Its config.json (num_experts, experts_per_token, rope_* ...) is mapped to an HF config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..families import FAMILIES
from ..modelconfig import ModelConfig
from .items import Expect, Item

# HF root name (per layer, after "model.layers.{i}.") -> original name (after "block.{i}.")
ORIGINAL_LAYER = {
    "input_layernorm.weight": "attn.norm.scale",
    "self_attn.sinks": "attn.sinks",
    "self_attn.o_proj.weight": "attn.out.weight",
    "self_attn.o_proj.bias": "attn.out.bias",
    "post_attention_layernorm.weight": "mlp.norm.scale",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.router.bias": "mlp.gate.bias",
    "mlp.experts.gate_up_proj_blocks": "mlp.mlp1_weight.blocks",
    "mlp.experts.gate_up_proj_scales": "mlp.mlp1_weight.scales",
    "mlp.experts.gate_up_proj_bias": "mlp.mlp1_bias",
    "mlp.experts.down_proj_blocks": "mlp.mlp2_weight.blocks",
    "mlp.experts.down_proj_scales": "mlp.mlp2_weight.scales",
    "mlp.experts.down_proj_bias": "mlp.mlp2_bias",
}
ORIGINAL_TOP = {"model.embed_tokens.weight": "embedding.weight", "model.norm.weight": "norm.scale", "lm_head.weight": "unembedding.weight"}
ORIGINAL_QKV = ("attn.qkv.weight", "attn.qkv.bias")


@dataclass(frozen=True)
class Dims:
    H: int
    V: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    experts: int

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


def dims(mc: ModelConfig) -> Dims:
    return Dims(H=mc.hidden, V=mc.vocab, layers=mc.layers, heads=mc.heads, kv_heads=mc.kv_heads, head_dim=mc.head_dim,
                inter=mc.intermediate, experts=mc.experts)


def is_original(ckpt: Checkpoint) -> bool:
    return "embedding.weight" in ckpt.tensors or "block.0.attn.qkv.weight" in ckpt.tensors


def attention(e: Expect, d: Dims, i: int, original: bool) -> None:
    p = f"model.layers.{i}.self_attn."
    spans = {"q_proj": (0, d.q), "k_proj": (d.q, d.q + d.kv), "v_proj": (d.q + d.kv, d.q + 2 * d.kv)}
    for n, (a, b) in spans.items():
        if original:
            w, bias = (f"block.{i}.{s}" for s in ORIGINAL_QKV)
            e.linear(w, (b - a, d.H), out=f"{p}{n}.weight", rows=(a, b), total_rows=d.q + 2 * d.kv)
            e.tensor(bias, (b - a,), out=f"{p}{n}.bias", rows=(a, b), total_rows=d.q + 2 * d.kv)
        else:
            e.linear(f"{p}{n}.weight", (b - a, d.H))
            e.tensor(f"{p}{n}.bias", (b - a,))


def experts(e: Expect, d: Dims, i: int, src: Callable[[str], str], mxfp4: bool) -> None:
    """MXFP4 blocks (upstream), F8 with scales (quantkit's fp8-block / mxfp8 outputs), or BF16 (transformers)."""
    p = f"model.layers.{i}.mlp.experts."
    shapes = {"gate_up_proj": (d.experts, 2 * d.inter, d.H), "down_proj": (d.experts, d.H, d.inter)}
    for n, shape in shapes.items():
        if mxfp4 or e.has(src(p + n + "_blocks")):
            e.mxfp4(src(p + n + "_blocks"), src(p + n + "_scales"), shape, out=p + n)
        elif e.has(p + n) and e.tensors[p + n].dtype == "F8_E4M3":
            e.fused_scaled(p + n, shape, out=p + n)
        else:
            e.stacked(p + n, shape, out=p + n)
        e.tensor(src(p + n + "_bias"), shape[:2], out=p + n + "_bias")


def layer(e: Expect, d: Dims, i: int, original: bool, mxfp4: bool) -> None:
    p = f"model.layers.{i}."

    def src(name: str) -> str:
        return f"block.{i}.{ORIGINAL_LAYER[name.removeprefix(p)]}" if original else name

    e.tensor(src(p + "input_layernorm.weight"), (d.H,), out=p + "input_layernorm.weight")
    attention(e, d, i, original)
    e.linear(src(p + "self_attn.o_proj.weight"), (d.H, d.q), out=p + "self_attn.o_proj.weight")
    e.tensor(src(p + "self_attn.o_proj.bias"), (d.H,), out=p + "self_attn.o_proj.bias")
    e.tensor(src(p + "self_attn.sinks"), (d.heads,), out=p + "self_attn.sinks")
    e.tensor(src(p + "post_attention_layernorm.weight"), (d.H,), out=p + "post_attention_layernorm.weight")
    e.linear(src(p + "mlp.router.weight"), (d.experts, d.H), out=p + "mlp.router.weight")
    e.tensor(src(p + "mlp.router.bias"), (d.experts,), out=p + "mlp.router.bias")
    experts(e, d, i, src, mxfp4)


def build(ckpt: Checkpoint, mc: ModelConfig, where: str) -> list[Item]:
    d, cfg = dims(mc), mc.raw
    original = is_original(ckpt)
    q = (cfg.get("quantization_config") or {}).get("quant_method")
    if q not in (None, "mxfp4", "fp8", "compressed-tensors"):
        raise CheckpointError(f"{where}: GPT-OSS sources are MXFP4 (quant_method mxfp4), BF16, or quantkit's fp8-block (fp8) "
                              f"and mxfp8 (compressed-tensors) outputs; quant_method {q!r} is not supported")
    mxfp4 = original or q == "mxfp4"
    e = Expect(FAMILIES["gpt-oss"], ckpt.tensors, cfg, where)

    def top(name: str) -> str:
        return ORIGINAL_TOP[name] if original else name

    e.tensor(top("model.embed_tokens.weight"), (d.V, d.H), out="model.embed_tokens.weight")
    for i in range(d.layers):
        layer(e, d, i, original, mxfp4)
    e.tensor(top("model.norm.weight"), (d.H,), out="model.norm.weight")
    e.linear(top("lm_head.weight"), (d.V, d.H), out="lm_head.weight")
    return e.finish()


def hf_config(original: dict, where: str) -> dict:
    """An HF GptOssForCausalLM config.json from the ``original/`` config (the mapping transformers' converter applies)."""
    try:
        n = original["num_hidden_layers"]
        rope = {"rope_type": "yarn", "factor": float(original["rope_scaling_factor"]), "beta_fast": float(original["rope_ntk_beta"]),
                "beta_slow": float(original["rope_ntk_alpha"]), "truncate": False,
                "original_max_position_embeddings": original.get("initial_context_length", 4096)}
        cfg = {
            "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": n,
            "num_local_experts": original["num_experts"], "num_experts_per_tok": original["experts_per_token"],
            "experts_per_token": original["experts_per_token"],
            **{k: original[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "head_dim", "num_attention_heads",
                                        "num_key_value_heads", "sliding_window", "swiglu_limit", "rope_theta")},
            "initial_context_length": original.get("initial_context_length", 4096), "rope_scaling": rope,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
            "attention_bias": True, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
        }
    except KeyError as e:
        raise CheckpointError(f"{where}: the original/ config.json has no {e.args[0]!r}") from None
    return cfg
