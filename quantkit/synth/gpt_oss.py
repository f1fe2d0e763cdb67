"""Synthetic GPT-OSS checkpoints (openai/gpt-oss-20b, -120b layouts; REFERENCE.md "GPT-OSS").

Root layout (HF, transformers models/gpt_oss): per layer ``self_attn.{q,k,v,o}_proj.{weight,bias}``,
``self_attn.sinks`` [heads], ``mlp.router.{weight,bias}`` [E, H] / [E], experts as MXFP4
``mlp.experts.gate_up_proj_blocks`` U8 [E, 2I, H/32, 16] + ``_scales`` U8 [E, 2I, H/32] +
``_bias`` [E, 2I] (gate/up rows INTERLEAVED: row 2k gate, 2k+1 up), ``down_proj_*`` [E, H, I/32, 16];
norms; ``model.embed_tokens.weight``, ``model.norm.weight``, ``lm_head.weight`` (untied).
Everything but the MXFP4 tensors is BF16.

``original`` layout (openai/gpt-oss torch/weights.py), written alone under ``original/`` with its
own config.json and dtypes.json: ``block.N.attn.{norm.scale, qkv.*, sinks, out.*}`` (qkv = q|k|v
rows), ``block.N.mlp.{norm.scale, gate.*, mlp1_weight.{blocks,scales}, mlp1_bias, mlp2_*}``,
``embedding.weight``, ``norm.scale``, ``unembedding.weight``.  Values are seeded by the root names,
so both layouts of one seed hold the same model.
"""

from __future__ import annotations


import torch

from . import weights
from .pieces import Piece, Synth, bf16_linear, bf16_rows, mxfp4_experts, norm, normal, tensor
from .tokenizer import TokenizerSpec

SPECIAL_BASE = 199998  # id of <|startoftext|> in o200k_harmony; names below keep real numbering
NAMED = {0: "<|startoftext|>", 1: "<|endoftext|>", 4: "<|return|>", 5: "<|constrain|>", 7: "<|channel|>",
         8: "<|start|>", 9: "<|end|>", 10: "<|message|>", 14: "<|call|>", 20: "<|endofprompt|>"}
O200K_SPLIT = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])
# Harmony rendering (openai-harmony): <|start|>{role}<|message|>{content}<|end|>
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ message['content'] }}<|end|>"
    "{%- else -%}<|start|>{{ message['role'] }}<|message|>{{ message['content'] }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)
YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
        "rope_type": "yarn", "truncate": False}


def tokenizer(d: dict) -> TokenizerSpec:
    tail = tuple(NAMED.get(i, f"<|reserved_{SPECIAL_BASE + i}|>") for i in range(d["vocab"] - d["tok_base"]))
    cfg = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
           "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids", "attention_mask"],
           "model_max_length": 1000000000000000019884624838656, "tokenizer_class": "PreTrainedTokenizerFast"}
    return TokenizerSpec(base=d["tok_base"], tail=tail, splits=(O200K_SPLIT,), config=cfg,
                         chat_template=CHAT_TEMPLATE, template_file=True)


def config(d: dict, tok: TokenizerSpec) -> dict:
    n = d["layers"]
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": tok.token_id("<|return|>"), "experts_per_token": d["top_k"], "head_dim": d["head_dim"],
        "hidden_act": "silu", "hidden_size": d["hidden"], "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": d["intermediate"],
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": d["heads"],
        "num_experts_per_tok": d["top_k"], "num_hidden_layers": n, "num_key_value_heads": d["kv_heads"],
        "num_local_experts": d["experts"], "output_router_logits": False, "pad_token_id": tok.token_id("<|endoftext|>"),
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05, "rope_scaling": dict(YARN), "rope_theta": 150000, "router_aux_loss_coef": 0.9,
        "sliding_window": d["sliding_window"], "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": d["vocab"],
    }


def generation_config(tok: TokenizerSpec) -> dict:
    stops = [tok.token_id(t) for t in ("<|return|>", "<|endoftext|>", "<|call|>")]
    return {"bos_token_id": tok.token_id("<|startoftext|>"), "do_sample": True, "eos_token_id": stops,
            "pad_token_id": tok.token_id("<|endoftext|>"), "transformers_version": "4.55.0.dev0"}


def original_config(d: dict) -> dict:
    """original/config.json: openai/gpt-oss ModelConfig fields."""
    return {
        "num_hidden_layers": d["layers"], "num_experts": d["experts"], "experts_per_token": d["top_k"],
        "vocab_size": d["vocab"], "hidden_size": d["hidden"], "intermediate_size": d["intermediate"],
        "swiglu_limit": 7.0, "head_dim": d["head_dim"], "num_attention_heads": d["heads"],
        "num_key_value_heads": d["kv_heads"], "sliding_window": d["sliding_window"], "initial_context_length": 4096,
        "rope_theta": 150000, "rope_scaling_factor": 32.0, "rope_ntk_alpha": 1, "rope_ntk_beta": 32,
    }


def _attn_root(s: int, d: dict, p: str) -> list[Piece]:
    h, hd = d["hidden"], d["head_dim"]
    q, kv = d["heads"] * hd, d["kv_heads"] * hd
    out = []
    for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        out += [bf16_linear(s, f"{p}self_attn.{name}.weight", rows, h, h**-0.5),
                normal(s, f"{p}self_attn.{name}.bias", (rows,), 0.02)]
    out += [bf16_linear(s, f"{p}self_attn.o_proj.weight", h, q, q**-0.5), normal(s, f"{p}self_attn.o_proj.bias", (h,), 0.02),
            normal(s, f"{p}self_attn.sinks", (d["heads"],), 1.0)]
    return out


def _mlp_root(s: int, d: dict, p: str) -> list[Piece]:
    h, i, e = d["hidden"], d["intermediate"], d["experts"]
    x = f"{p}mlp.experts."
    return [
        bf16_linear(s, f"{p}mlp.router.weight", e, h, h**-0.5), normal(s, f"{p}mlp.router.bias", (e,), 0.02),
        mxfp4_experts(s, x + "gate_up_proj_blocks", x + "gate_up_proj_scales", x + "gate_up_proj", e, 2 * i, h, h**-0.5),
        normal(s, x + "gate_up_proj_bias", (e, 2 * i), 0.02),
        mxfp4_experts(s, x + "down_proj_blocks", x + "down_proj_scales", x + "down_proj", e, h, i, i**-0.5),
        normal(s, x + "down_proj_bias", (e, h), 0.02),
    ]


def _root(s: int, d: dict) -> list[Piece]:
    h, v = d["hidden"], d["vocab"]
    out = [bf16_linear(s, "model.embed_tokens.weight", v, h, 1.0)]
    for n in range(d["layers"]):
        p = f"model.layers.{n}."
        out += [norm(s, p + "input_layernorm.weight", h), *_attn_root(s, d, p),
                norm(s, p + "post_attention_layernorm.weight", h), *_mlp_root(s, d, p)]
    return out + [norm(s, "model.norm.weight", h), bf16_linear(s, "lm_head.weight", v, h, h**-0.5)]


def _qkv_bias(s: int, p: str, parts: list[tuple[str, int]]) -> torch.Tensor:
    return torch.cat([weights.normal(s, f"{p}self_attn.{n}.bias", (r,), 0.02) for n, r in parts])


def _block_original(s: int, d: dict, n: int) -> list[Piece]:
    h, i, e, hd = d["hidden"], d["intermediate"], d["experts"], d["head_dim"]
    q, kv = d["heads"] * hd, d["kv_heads"] * hd
    p, b = f"model.layers.{n}.", f"block.{n}."
    parts = [("q_proj", q), ("k_proj", kv), ("v_proj", kv)]
    x = f"{p}mlp.experts."
    return [
        norm(s, b + "attn.norm.scale", h, key=p + "input_layernorm.weight"),
        bf16_rows(s, b + "attn.qkv.weight", [(f"{p}self_attn.{k}.weight", r) for k, r in parts], h, h**-0.5),
        tensor(b + "attn.qkv.bias", torch.bfloat16, (q + 2 * kv,), lambda: _qkv_bias(s, p, parts)),
        normal(s, b + "attn.sinks", (d["heads"],), 1.0, key=p + "self_attn.sinks"),
        bf16_linear(s, b + "attn.out.weight", h, q, q**-0.5, key=p + "self_attn.o_proj.weight"),
        normal(s, b + "attn.out.bias", (h,), 0.02, key=p + "self_attn.o_proj.bias"),
        norm(s, b + "mlp.norm.scale", h, key=p + "post_attention_layernorm.weight"),
        bf16_linear(s, b + "mlp.gate.weight", e, h, h**-0.5, key=p + "mlp.router.weight"),
        normal(s, b + "mlp.gate.bias", (e,), 0.02, key=p + "mlp.router.bias"),
        mxfp4_experts(s, b + "mlp.mlp1_weight.blocks", b + "mlp.mlp1_weight.scales", x + "gate_up_proj", e, 2 * i, h, h**-0.5),
        normal(s, b + "mlp.mlp1_bias", (e, 2 * i), 0.02, key=x + "gate_up_proj_bias"),
        mxfp4_experts(s, b + "mlp.mlp2_weight.blocks", b + "mlp.mlp2_weight.scales", x + "down_proj", e, h, i, i**-0.5),
        normal(s, b + "mlp.mlp2_bias", (e, h), 0.02, key=x + "down_proj_bias"),
    ]


def _original(s: int, d: dict) -> list[Piece]:
    h, v = d["hidden"], d["vocab"]
    out = [bf16_linear(s, "embedding.weight", v, h, 1.0, key="model.embed_tokens.weight")]
    for n in range(d["layers"]):
        out += _block_original(s, d, n)
    return out + [norm(s, "norm.scale", h, key="model.norm.weight"),
                  bf16_linear(s, "unembedding.weight", v, h, h**-0.5, key="lm_head.weight")]


def dtypes_json(pieces: list[Piece]) -> dict:
    """original/dtypes.json: tensor name -> BF16 / FP4 (blocks) / UE8 (scales)."""
    tag = {torch.bfloat16: "BF16", torch.float32: "F32"}
    return {sp.name: ("FP4" if sp.name.endswith(".blocks") else "UE8" if sp.name.endswith(".scales") else tag[sp.dtype])
            for p in pieces for sp in p.specs}


def build(d: dict, seed: int, layout: str, scale_fmt: str) -> Synth:
    if scale_fmt != "float":
        raise ValueError("--scale-fmt applies to deepseek-v3 only (GPT-OSS experts are MXFP4 with E8M0 scales)")
    tok = tokenizer(d)
    cfg, gen = config(d, tok), generation_config(tok)
    if layout == "root":
        return Synth(cfg, gen, _root(seed, d), tok)
    pieces = _original(seed, d)
    extra = {"original/config.json": original_config(d), "original/dtypes.json": dtypes_json(pieces)}
    return Synth(cfg, gen, pieces, tok, weights_dir="original", extra=extra)
