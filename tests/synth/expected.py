"""Expected tensor names, dtypes and shapes per family, written out from REFERENCE.md (and the
upstream checkpoints it describes), as functions of config.json fields.  Independent of
quantkit.synth: a synthesized checkpoint must hold exactly these tensors."""

from __future__ import annotations

Table = dict[str, tuple[str, tuple[int, ...]]]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _fp8(name: str, out: int, inp: int) -> Table:
    """DeepSeek fine-grained FP8: weight F8_E4M3 [out, in] + weight_scale_inv F32 [ceil(out/128), ceil(in/128)]."""
    return {name + ".weight": ("F8_E4M3", (out, inp)), name + ".weight_scale_inv": ("F32", (_ceil(out, 128), _ceil(inp, 128)))}


def gpt_oss_root(c: dict) -> Table:
    h, i, e, v = c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["vocab_size"]
    q, kv, nh = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], c["num_attention_heads"]
    t: Table = {"model.embed_tokens.weight": ("BF16", (v, h)), "model.norm.weight": ("BF16", (h,)),
                "lm_head.weight": ("BF16", (v, h))}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t.update({
            p + "input_layernorm.weight": ("BF16", (h,)), p + "post_attention_layernorm.weight": ("BF16", (h,)),
            p + "self_attn.q_proj.weight": ("BF16", (q, h)), p + "self_attn.q_proj.bias": ("BF16", (q,)),
            p + "self_attn.k_proj.weight": ("BF16", (kv, h)), p + "self_attn.k_proj.bias": ("BF16", (kv,)),
            p + "self_attn.v_proj.weight": ("BF16", (kv, h)), p + "self_attn.v_proj.bias": ("BF16", (kv,)),
            p + "self_attn.o_proj.weight": ("BF16", (h, q)), p + "self_attn.o_proj.bias": ("BF16", (h,)),
            p + "self_attn.sinks": ("BF16", (nh,)),
            p + "mlp.router.weight": ("BF16", (e, h)), p + "mlp.router.bias": ("BF16", (e,)),
            p + "mlp.experts.gate_up_proj_blocks": ("U8", (e, 2 * i, h // 32, 16)),
            p + "mlp.experts.gate_up_proj_scales": ("U8", (e, 2 * i, h // 32)),
            p + "mlp.experts.gate_up_proj_bias": ("BF16", (e, 2 * i)),
            p + "mlp.experts.down_proj_blocks": ("U8", (e, h, i // 32, 16)),
            p + "mlp.experts.down_proj_scales": ("U8", (e, h, i // 32)),
            p + "mlp.experts.down_proj_bias": ("BF16", (e, h)),
        })
    return t


def gpt_oss_original(c: dict) -> Table:
    """original/ layout; ``c`` is original/config.json (openai/gpt-oss ModelConfig)."""
    h, i, e, v = c["hidden_size"], c["intermediate_size"], c["num_experts"], c["vocab_size"]
    q, kv, nh = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], c["num_attention_heads"]
    t: Table = {"embedding.weight": ("BF16", (v, h)), "norm.scale": ("BF16", (h,)), "unembedding.weight": ("BF16", (v, h))}
    for n in range(c["num_hidden_layers"]):
        b = f"block.{n}."
        t.update({
            b + "attn.norm.scale": ("BF16", (h,)), b + "attn.qkv.weight": ("BF16", (q + 2 * kv, h)),
            b + "attn.qkv.bias": ("BF16", (q + 2 * kv,)), b + "attn.sinks": ("BF16", (nh,)),
            b + "attn.out.weight": ("BF16", (h, q)), b + "attn.out.bias": ("BF16", (h,)),
            b + "mlp.norm.scale": ("BF16", (h,)), b + "mlp.gate.weight": ("BF16", (e, h)), b + "mlp.gate.bias": ("BF16", (e,)),
            b + "mlp.mlp1_weight.blocks": ("U8", (e, 2 * i, h // 32, 16)), b + "mlp.mlp1_weight.scales": ("U8", (e, 2 * i, h // 32)),
            b + "mlp.mlp1_bias": ("BF16", (e, 2 * i)),
            b + "mlp.mlp2_weight.blocks": ("U8", (e, h, i // 32, 16)), b + "mlp.mlp2_weight.scales": ("U8", (e, h, i // 32)),
            b + "mlp.mlp2_bias": ("BF16", (e, h)),
        })
    return t


def _deepseek_layer(c: dict, n: int) -> Table:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, vh = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    ql, kvl = c["q_lora_rank"], c["kv_lora_rank"]
    p, a = f"model.layers.{n}.", f"model.layers.{n}.self_attn."
    t: Table = {p + "input_layernorm.weight": ("BF16", (h,)), p + "post_attention_layernorm.weight": ("BF16", (h,)),
                a + "q_a_layernorm.weight": ("BF16", (ql,)), a + "kv_a_layernorm.weight": ("BF16", (kvl,))}
    t |= _fp8(a + "q_a_proj", ql, h) | _fp8(a + "q_b_proj", heads * (nope + rope), ql)
    t |= _fp8(a + "kv_a_proj_with_mqa", kvl + rope, h) | _fp8(a + "kv_b_proj", heads * (nope + vh), kvl)
    t |= _fp8(a + "o_proj", h, heads * vh)
    if n < c["first_k_dense_replace"]:
        im = c["intermediate_size"]
        return t | _fp8(p + "mlp.gate_proj", im, h) | _fp8(p + "mlp.up_proj", im, h) | _fp8(p + "mlp.down_proj", h, im)
    e, mi, sh = c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"] * c["moe_intermediate_size"]
    t |= {p + "mlp.gate.weight": ("BF16", (e, h)), p + "mlp.gate.e_score_correction_bias": ("F32", (e,))}
    for x in range(e):
        q = f"{p}mlp.experts.{x}."
        t |= _fp8(q + "gate_proj", mi, h) | _fp8(q + "up_proj", mi, h) | _fp8(q + "down_proj", h, mi)
    q = p + "mlp.shared_experts."
    return t | _fp8(q + "gate_proj", sh, h) | _fp8(q + "up_proj", sh, h) | _fp8(q + "down_proj", h, sh)


def deepseek(c: dict) -> Table:
    h, v, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    t: Table = {"model.embed_tokens.weight": ("BF16", (v, h)), "model.norm.weight": ("BF16", (h,)),
                "lm_head.weight": ("BF16", (v, h))}
    for n in range(layers + c["num_nextn_predict_layers"]):
        t |= _deepseek_layer(c, n)
    m = f"model.layers.{layers}."  # MTP: extra tensors of layer L
    t |= {m + "embed_tokens.weight": ("BF16", (v, h)), m + "enorm.weight": ("BF16", (h,)), m + "hnorm.weight": ("BF16", (h,)),
          m + "eh_proj.weight": ("BF16", (h, 2 * h)), m + "shared_head.norm.weight": ("BF16", (h,)),
          m + "shared_head.head.weight": ("BF16", (v, h))}
    return t


def qwen3(c: dict) -> Table:
    h, v, hd = c["hidden_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    t: Table = {"model.embed_tokens.weight": ("BF16", (v, h)), "model.norm.weight": ("BF16", (h,)),
                "lm_head.weight": ("BF16", (v, h))}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t |= {p + "input_layernorm.weight": ("BF16", (h,)), p + "post_attention_layernorm.weight": ("BF16", (h,)),
              p + "self_attn.q_proj.weight": ("BF16", (q, h)), p + "self_attn.k_proj.weight": ("BF16", (kv, h)),
              p + "self_attn.v_proj.weight": ("BF16", (kv, h)), p + "self_attn.o_proj.weight": ("BF16", (h, q)),
              p + "self_attn.q_norm.weight": ("BF16", (hd,)), p + "self_attn.k_norm.weight": ("BF16", (hd,))}
        if "num_experts" not in c or n in c.get("mlp_only_layers", []):
            im, mlps = c["intermediate_size"], [p + "mlp."]
        else:
            im, mlps = c["moe_intermediate_size"], [f"{p}mlp.experts.{x}." for x in range(c["num_experts"])]
            t[p + "mlp.gate.weight"] = ("BF16", (c["num_experts"], h))
        for m in mlps:
            t |= {m + "gate_proj.weight": ("BF16", (im, h)), m + "up_proj.weight": ("BF16", (im, h)),
                  m + "down_proj.weight": ("BF16", (h, im))}
    return t


ROOT = {"gpt-oss": gpt_oss_root, "deepseek-v3": deepseek, "qwen3": qwen3, "qwen3-moe": qwen3}
