"""Synthetic DeepSeek-V3 / R1 / V3.1 checkpoints (deepseek-ai/DeepSeek-V3 README_WEIGHTS.md, config.json;
REFERENCE.md "DeepSeek-V3").

Every projection is FP8 E4M3 ``weight`` + F32 ``weight_scale_inv`` [ceil(out/128), ceil(in/128)]
(``--scale-fmt ue8m0``: power-of-two scales, V3.1's ``scale_fmt: ue8m0``).  Per layer: MLA
``self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
o_proj}``; layers below ``first_k_dense_replace`` have a dense ``mlp.{gate,up,down}_proj``, the
others ``mlp.gate.weight`` BF16 [E, H], ``mlp.gate.e_score_correction_bias`` F32 [E],
``mlp.experts.{e}.{gate,up,down}_proj`` and ``mlp.shared_experts.*``.  The MTP layer
``model.layers.{L}`` (L = num_hidden_layers) adds ``embed_tokens``, ``enorm``, ``hnorm``,
``eh_proj`` [H, 2H], ``shared_head.norm``, ``shared_head.head`` (all BF16) to a full decoder
layer.  Embeddings, lm_head and norms are BF16.
"""

from __future__ import annotations

import torch

from .pieces import Piece, Synth, bf16_linear, fp8_linear, norm, normal
from .tokenizer import TokenizerSpec

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# ids 128798.. in the released tokenizer, after the <｜place▁holder▁no▁N｜> tokens from 128000
NAMED = ("<think>", "</think>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>",
         "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
         "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
         "<｜tool▁sep｜>")
SPLITS = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system_prompt='') -%}"
    "{%- for message in messages -%}{%- if message['role'] == 'system' -%}{%- set ns.system_prompt = message['content'] -%}"
    "{%- endif -%}{%- endfor -%}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<｜Assistant｜>' }}{%- endif -%}"
)
YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"}


def tokenizer(d: dict) -> TokenizerSpec:
    tail = tuple(f"<｜place▁holder▁no▁{i}｜>" for i in range(d["tok_reserved"])) + NAMED
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "clean_up_tokenization_spaces": False,
           "eos_token": EOS, "legacy": True, "model_max_length": 131072, "pad_token": EOS, "sp_model_kwargs": {},
           "unk_token": None, "tokenizer_class": "LlamaTokenizerFast"}
    return TokenizerSpec(base=d["tok_base"], tail=tail, head=(BOS, EOS, PAD), splits=SPLITS, bos_prefix=BOS,
                         config=cfg, chat_template=CHAT_TEMPLATE)


def config(d: dict, tok: TokenizerSpec, scale_fmt: str) -> dict:
    quant = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    if scale_fmt == "ue8m0":
        quant["scale_fmt"] = "ue8m0"
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001, "bos_token_id": tok.token_id(BOS), "eos_token_id": tok.token_id(EOS), "ep_size": 1,
        "first_k_dense_replace": d["first_dense"], "hidden_act": "silu", "hidden_size": d["hidden"],
        "initializer_range": 0.02, "intermediate_size": d["intermediate"], "kv_lora_rank": d["kv_lora"],
        "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": d["moe_intermediate"],
        "moe_layer_freq": 1, "n_group": d["n_group"], "n_routed_experts": d["experts"], "n_shared_experts": d["shared"],
        "norm_topk_prob": True, "num_attention_heads": d["heads"], "num_experts_per_tok": d["top_k"],
        "num_hidden_layers": d["layers"], "num_key_value_heads": d["heads"], "num_nextn_predict_layers": 1,
        "pretraining_tp": 1, "q_lora_rank": d["q_lora"], "qk_nope_head_dim": d["qk_nope"],
        "qk_rope_head_dim": d["qk_rope"], "quantization_config": quant, "rms_norm_eps": 1e-06,
        "rope_scaling": dict(YARN), "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "seq_aux": True, "tie_word_embeddings": False, "topk_group": d["topk_group"], "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": d["v_head"],
        "vocab_size": d["vocab"],
    }


def generation_config(tok: TokenizerSpec) -> dict:
    return {"_from_model_config": True, "bos_token_id": tok.token_id(BOS), "eos_token_id": tok.token_id(EOS),
            "do_sample": True, "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.46.3"}


def _fp8(s: int, name: str, rows: int, cols: int, fmt: str) -> Piece:
    return fp8_linear(s, name, rows, cols, cols**-0.5, fmt)


def _attn(s: int, d: dict, p: str, fmt: str) -> list[Piece]:
    h, heads, a = d["hidden"], d["heads"], p + "self_attn."
    return [
        _fp8(s, a + "q_a_proj.weight", d["q_lora"], h, fmt),
        norm(s, a + "q_a_layernorm.weight", d["q_lora"]),
        _fp8(s, a + "q_b_proj.weight", heads * (d["qk_nope"] + d["qk_rope"]), d["q_lora"], fmt),
        _fp8(s, a + "kv_a_proj_with_mqa.weight", d["kv_lora"] + d["qk_rope"], h, fmt),
        norm(s, a + "kv_a_layernorm.weight", d["kv_lora"]),
        _fp8(s, a + "kv_b_proj.weight", heads * (d["qk_nope"] + d["v_head"]), d["kv_lora"], fmt),
        _fp8(s, a + "o_proj.weight", h, heads * d["v_head"], fmt),
    ]


def _mlp(s: int, p: str, h: int, inter: int, fmt: str) -> list[Piece]:
    return [_fp8(s, p + "gate_proj.weight", inter, h, fmt), _fp8(s, p + "up_proj.weight", inter, h, fmt),
            _fp8(s, p + "down_proj.weight", h, inter, fmt)]


def _moe(s: int, d: dict, p: str, fmt: str) -> list[Piece]:
    h, e, m = d["hidden"], d["experts"], p + "mlp."
    out = [bf16_linear(s, m + "gate.weight", e, h, h**-0.5),
           normal(s, m + "gate.e_score_correction_bias", (e,), 0.1, dtype=torch.float32)]
    for i in range(e):
        out += _mlp(s, f"{m}experts.{i}.", h, d["moe_intermediate"], fmt)
    return out + _mlp(s, m + "shared_experts.", h, d["shared"] * d["moe_intermediate"], fmt)


def _layer(s: int, d: dict, n: int, fmt: str) -> list[Piece]:
    h, p = d["hidden"], f"model.layers.{n}."
    mlp = _mlp(s, p + "mlp.", h, d["intermediate"], fmt) if n < d["first_dense"] else _moe(s, d, p, fmt)
    return [norm(s, p + "input_layernorm.weight", h), *_attn(s, d, p, fmt),
            norm(s, p + "post_attention_layernorm.weight", h), *mlp]


def _mtp(s: int, d: dict, fmt: str) -> list[Piece]:
    """The multi-token-prediction layer model.layers.{L} (num_nextn_predict_layers = 1)."""
    h, v, n = d["hidden"], d["vocab"], d["layers"]
    p = f"model.layers.{n}."
    return [
        bf16_linear(s, p + "embed_tokens.weight", v, h, 1.0),
        norm(s, p + "enorm.weight", h), norm(s, p + "hnorm.weight", h),
        bf16_linear(s, p + "eh_proj.weight", h, 2 * h, (2 * h) ** -0.5),
        *_layer(s, d, n, fmt),
        norm(s, p + "shared_head.norm.weight", h),
        bf16_linear(s, p + "shared_head.head.weight", v, h, h**-0.5),
    ]


def build(d: dict, seed: int, layout: str, scale_fmt: str) -> Synth:
    if layout != "root":
        raise ValueError(f"--layout {layout} applies to gpt-oss only; deepseek-v3 ships one layout")
    if d["experts"] % d["n_group"] or d["topk_group"] > d["n_group"]:
        raise ValueError(f"n_group {d['n_group']} / topk_group {d['topk_group']} do not fit {d['experts']} experts")
    tok = tokenizer(d)
    h, v = d["hidden"], d["vocab"]
    pieces = [bf16_linear(seed, "model.embed_tokens.weight", v, h, 1.0)]
    for n in range(d["layers"]):
        pieces += _layer(seed, d, n, scale_fmt)
    pieces += _mtp(seed, d, scale_fmt)
    pieces += [norm(seed, "model.norm.weight", h), bf16_linear(seed, "lm_head.weight", v, h, h**-0.5)]
    return Synth(config(d, tok, scale_fmt), generation_config(tok), pieces, tok)
