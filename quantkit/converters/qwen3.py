"""Qwen3 and Qwen3-MoE (transformers models/qwen3, qwen3_moe): names are kept exactly.

Per layer ``model.layers.{i}.``:
  input_layernorm.weight [H], post_attention_layernorm.weight [H]
  self_attn.{q,k,v,o}_proj.weight  q [heads*hd, H], k/v [kv_heads*hd, H], o [H, heads*hd]
                                   (+ .bias when attention_bias)
  self_attn.{q,k}_norm.weight [hd]
  dense MLP: mlp.{gate,up}_proj.weight [I, H], mlp.down_proj.weight [H, I]
  MoE layer: mlp.gate.weight [E, H] (router, no bias),
             mlp.experts.{e}.{gate,up}_proj.weight [Im, H], mlp.experts.{e}.down_proj.weight [H, Im]
  A layer is MoE when num_experts > 0, it is not in mlp_only_layers and (i+1) % decoder_sparse_step == 0.
Top level: model.embed_tokens.weight [V, H], model.norm.weight [H], lm_head.weight [V, H]
(absent when tie_word_embeddings).  head_dim: Qwen3's config default is 128, Qwen3-MoE's
hidden_size // num_attention_heads.  Only these keys are read; any other config field passes through.
Qwen's own FP8 releases store the same names with F8_E4M3 weights and ``weight_scale_inv``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint
from ..families import FAMILIES
from .items import Expect, Item
from .registry import register

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


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
    moe_inter: int
    bias: bool
    tied: bool
    sparse: tuple[bool, ...]


def dims(cfg: dict, moe: bool) -> Dims:
    H, heads, n = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    experts = cfg.get("num_experts", 128 if moe else 0) if moe else 0
    step, only = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
    sparse = tuple(moe and experts > 0 and i not in only and (i + 1) % step == 0 for i in range(n))
    return Dims(
        H=H, V=cfg["vocab_size"], layers=n, heads=heads, kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or (H // heads if moe else 128), inter=cfg.get("intermediate_size", 0),
        experts=experts, moe_inter=cfg.get("moe_intermediate_size", 0), bias=bool(cfg.get("attention_bias", False)),
        tied=bool(cfg.get("tie_word_embeddings", False)), sparse=sparse,
    )


def attn_shapes(d: Dims) -> dict[str, tuple[int, int]]:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    return {"q_proj": (q, d.H), "k_proj": (kv, d.H), "v_proj": (kv, d.H), "o_proj": (d.H, q)}


def mlp_shapes(inter: int, H: int) -> dict[str, tuple[int, int]]:
    return {"gate_proj": (inter, H), "up_proj": (inter, H), "down_proj": (H, inter)}


def mlp(e: Expect, prefix: str, inter: int, H: int) -> None:
    for n, shape in mlp_shapes(inter, H).items():
        e.linear(f"{prefix}{n}.weight", shape)


def layer(e: Expect, d: Dims, i: int) -> None:
    p = f"model.layers.{i}."
    e.tensor(p + "input_layernorm.weight", (d.H,))
    for n, shape in attn_shapes(d).items():
        e.linear(f"{p}self_attn.{n}.weight", shape)
        if d.bias:
            e.tensor(f"{p}self_attn.{n}.bias", (shape[0],))
    e.tensor(p + "self_attn.q_norm.weight", (d.head_dim,))
    e.tensor(p + "self_attn.k_norm.weight", (d.head_dim,))
    e.tensor(p + "post_attention_layernorm.weight", (d.H,))
    if d.sparse[i]:
        e.linear(p + "mlp.gate.weight", (d.experts, d.H))
        for x in range(d.experts):
            mlp(e, f"{p}mlp.experts.{x}.", d.moe_inter, d.H)
    else:
        mlp(e, p + "mlp.", d.inter, d.H)


def build(ckpt: Checkpoint, cfg: dict, where: str, moe: bool) -> list[Item]:
    d = dims(cfg, moe)
    e = Expect(FAMILIES["qwen3-moe" if moe else "qwen3"], ckpt.tensors, cfg, where)
    e.tensor("model.embed_tokens.weight", (d.V, d.H))
    for i in range(d.layers):
        layer(e, d, i)
    e.tensor("model.norm.weight", (d.H,))
    if not d.tied or e.has("lm_head.weight"):
        e.linear("lm_head.weight", (d.V, d.H))
    return e.finish()


register("qwen3", lambda ckpt, cfg, where: build(ckpt, cfg, where, moe=False))
register("qwen3-moe", lambda ckpt, cfg, where: build(ckpt, cfg, where, moe=True))
