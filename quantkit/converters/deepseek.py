"""DeepSeek-V3 / R1 / V3.1 (HF repo layout, README_WEIGHTS.md; transformers models/deepseek_v3): names kept exactly.

Per layer ``model.layers.{i}.`` (MLA attention):
  input_layernorm.weight [H], post_attention_layernorm.weight [H]
  self_attn.q_a_proj.weight [q_lora, H], self_attn.q_a_layernorm.weight [q_lora],
  self_attn.q_b_proj.weight [heads*(nope+rope), q_lora]    (q_proj [heads*(nope+rope), H] when q_lora_rank is null)
  self_attn.kv_a_proj_with_mqa.weight [kv_lora+rope, H], self_attn.kv_a_layernorm.weight [kv_lora]
  self_attn.kv_b_proj.weight [heads*(nope+v), kv_lora], self_attn.o_proj.weight [H, heads*v]
  dense (i < first_k_dense_replace): mlp.{gate,up}_proj.weight [I, H], mlp.down_proj.weight [H, I]
  MoE: mlp.gate.weight [E, H] (BF16 router), mlp.gate.e_score_correction_bias [E] (F32, noaux_tc),
       mlp.experts.{e}.{gate,up}_proj.weight [Im, H], mlp.experts.{e}.down_proj.weight [H, Im],
       mlp.shared_experts.{gate,up}_proj.weight [Im*n_shared, H], mlp.shared_experts.down_proj.weight [H, Im*n_shared]
MTP layers ``model.layers.{L+j}`` for j < num_nextn_predict_layers (kept, not dropped): a full MoE
decoder layer plus enorm.weight [H], hnorm.weight [H], eh_proj.weight [H, 2H] (BF16 upstream),
embed_tokens.weight [V, H], shared_head.norm.weight [H], shared_head.head.weight [V, H].
Top level: model.embed_tokens.weight, model.norm.weight, lm_head.weight.
Every projection is F8_E4M3 with ``weight_scale_inv`` [ceil(N/128), ceil(K/128)] in the official release.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint
from ..families import FAMILIES
from .items import Expect, Item
from .registry import register


@dataclass(frozen=True)
class Dims:
    H: int
    V: int
    layers: int
    mtp: int
    heads: int
    q_lora: int | None
    kv_lora: int
    nope: int
    rope: int
    v: int
    inter: int
    moe_inter: int
    experts: int
    shared: int
    dense: int
    freq: int
    bias: bool


def dims(cfg: dict) -> Dims:
    return Dims(
        H=cfg["hidden_size"], V=cfg["vocab_size"], layers=cfg["num_hidden_layers"],
        mtp=cfg.get("num_nextn_predict_layers", 0), heads=cfg["num_attention_heads"], q_lora=cfg.get("q_lora_rank"),
        kv_lora=cfg["kv_lora_rank"], nope=cfg["qk_nope_head_dim"], rope=cfg["qk_rope_head_dim"], v=cfg["v_head_dim"],
        inter=cfg["intermediate_size"], moe_inter=cfg["moe_intermediate_size"], experts=cfg.get("n_routed_experts") or 0,
        shared=cfg.get("n_shared_experts") or 0, dense=cfg.get("first_k_dense_replace", 0), freq=cfg.get("moe_layer_freq", 1),
        bias=cfg.get("topk_method", "noaux_tc") == "noaux_tc",
    )


def attn_shapes(d: Dims) -> dict[str, tuple[int, int]]:
    qh = d.heads * (d.nope + d.rope)
    s = {"q_a_proj": (d.q_lora, d.H), "q_b_proj": (qh, d.q_lora)} if d.q_lora else {"q_proj": (qh, d.H)}
    s["kv_a_proj_with_mqa"] = (d.kv_lora + d.rope, d.H)
    s["kv_b_proj"] = (d.heads * (d.nope + d.v), d.kv_lora)
    s["o_proj"] = (d.H, d.heads * d.v)
    return s


def mlp(e: Expect, prefix: str, inter: int, H: int) -> None:
    for n, shape in {"gate_proj": (inter, H), "up_proj": (inter, H), "down_proj": (H, inter)}.items():
        e.linear(f"{prefix}{n}.weight", shape)


def attention(e: Expect, d: Dims, p: str) -> None:
    for n, shape in attn_shapes(d).items():
        e.linear(f"{p}self_attn.{n}.weight", shape)
        if n == "q_a_proj":
            e.tensor(f"{p}self_attn.q_a_layernorm.weight", (d.q_lora,))
        if n == "kv_a_proj_with_mqa":
            e.tensor(f"{p}self_attn.kv_a_layernorm.weight", (d.kv_lora,))


def layer(e: Expect, d: Dims, i: int) -> None:
    p = f"model.layers.{i}."
    e.tensor(p + "input_layernorm.weight", (d.H,))
    attention(e, d, p)
    e.tensor(p + "post_attention_layernorm.weight", (d.H,))
    if d.experts and i >= d.dense and i % d.freq == 0:
        e.linear(p + "mlp.gate.weight", (d.experts, d.H))
        if d.bias:
            e.tensor(p + "mlp.gate.e_score_correction_bias", (d.experts,))
        for x in range(d.experts):
            mlp(e, f"{p}mlp.experts.{x}.", d.moe_inter, d.H)
        if d.shared:
            mlp(e, p + "mlp.shared_experts.", d.moe_inter * d.shared, d.H)
    else:
        mlp(e, p + "mlp.", d.inter, d.H)


def mtp_layer(e: Expect, d: Dims, i: int) -> None:
    p = f"model.layers.{i}."
    e.tensor(p + "embed_tokens.weight", (d.V, d.H))
    e.tensor(p + "enorm.weight", (d.H,))
    e.tensor(p + "hnorm.weight", (d.H,))
    e.linear(p + "eh_proj.weight", (d.H, 2 * d.H))
    layer(e, d, i)
    e.tensor(p + "shared_head.norm.weight", (d.H,))
    e.linear(p + "shared_head.head.weight", (d.V, d.H))


def build(ckpt: Checkpoint, cfg: dict, where: str) -> list[Item]:
    d = dims(cfg)
    e = Expect(FAMILIES["deepseek-v3"], ckpt.tensors, cfg, where)
    e.tensor("model.embed_tokens.weight", (d.V, d.H))
    for i in range(d.layers):
        layer(e, d, i)
    for j in range(d.mtp):
        mtp_layer(e, d, d.layers + j)
    e.tensor("model.norm.weight", (d.H,))
    e.linear("lm_head.weight", (d.V, d.H))
    return e.finish()


register("deepseek-v3", build)
