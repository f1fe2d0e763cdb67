"""Synthetic Qwen3 / Qwen3-MoE checkpoints, BF16 as a fine-tune ships them (transformers qwen3,
qwen3_moe; Qwen/Qwen3-8B, Qwen3-30B-A3B, Qwen3-235B-A22B config.json; REFERENCE.md "Qwen3").

Per layer: ``self_attn.{q,k,v,o}_proj.weight`` (no bias; q width heads x head_dim may exceed
hidden), ``self_attn.{q,k}_norm.weight`` [head_dim], ``input_layernorm``,
``post_attention_layernorm``; dense ``mlp.{gate,up,down}_proj.weight``, or for MoE
``mlp.gate.weight`` [E, H] and ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (no shared expert).
The config carries the extra fields a fine-tune's save adds (torch_dtype, layer_types, pad id,
provenance), which readers must tolerate.
"""

from __future__ import annotations

from .pieces import Piece, Synth, bf16_linear, norm
from .tokenizer import TokenizerSpec

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
            "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
            "</tool_response>", "<think>", "</think>")  # ids 151643.. in the released tokenizer
SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
UPSTREAM = {"qwen3": "Qwen/Qwen3-8B", "qwen3-moe": "Qwen/Qwen3-30B-A3B"}


def tokenizer(d: dict) -> TokenizerSpec:
    cfg = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "clean_up_tokenization_spaces": False,
           "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
           "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    return TokenizerSpec(base=d["tok_base"], tail=SPECIALS, splits=(SPLIT,), nfc=True, config=cfg,
                         chat_template=CHAT_TEMPLATE)


def config(d: dict, tok: TokenizerSpec, moe: bool) -> dict:
    n = d["layers"]
    cfg = {
        "_name_or_path": UPSTREAM["qwen3-moe" if moe else "qwen3"],
        "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": tok.token_id("<|endoftext|>"), "eos_token_id": tok.token_id("<|im_end|>"),
        "head_dim": d["head_dim"], "hidden_act": "silu", "hidden_size": d["hidden"], "initializer_range": 0.02,
        "intermediate_size": d["intermediate"], "layer_types": ["full_attention"] * n,
        "max_position_embeddings": d["max_positions"], "max_window_layers": n,
        "model_type": "qwen3_moe" if moe else "qwen3", "num_attention_heads": d["heads"], "num_hidden_layers": n,
        "num_key_value_heads": d["kv_heads"], "pad_token_id": tok.token_id("<|endoftext|>"), "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.55.4", "use_cache": True, "use_sliding_window": False,
        "vocab_size": d["vocab"],
    }
    if moe:
        cfg.update({"decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": d["moe_intermediate"],
                    "norm_topk_prob": True, "num_experts": d["experts"], "num_experts_per_tok": d["top_k"],
                    "output_router_logits": False, "router_aux_loss_coef": 0.001})
    return dict(sorted(cfg.items()))


def generation_config(tok: TokenizerSpec) -> dict:
    return {"bos_token_id": tok.token_id("<|endoftext|>"), "do_sample": True,
            "eos_token_id": [tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")],
            "pad_token_id": tok.token_id("<|endoftext|>"), "temperature": 0.6, "top_k": 20, "top_p": 0.95,
            "transformers_version": "4.55.4"}


def _mlp(s: int, p: str, h: int, inter: int) -> list[Piece]:
    return [bf16_linear(s, p + "gate_proj.weight", inter, h, h**-0.5), bf16_linear(s, p + "up_proj.weight", inter, h, h**-0.5),
            bf16_linear(s, p + "down_proj.weight", h, inter, inter**-0.5)]


def _layer(s: int, d: dict, n: int, moe: bool) -> list[Piece]:
    h, hd, p = d["hidden"], d["head_dim"], f"model.layers.{n}."
    q, kv, a = d["heads"] * hd, d["kv_heads"] * hd, p + "self_attn."
    out = [
        norm(s, p + "input_layernorm.weight", h),
        bf16_linear(s, a + "q_proj.weight", q, h, h**-0.5), bf16_linear(s, a + "k_proj.weight", kv, h, h**-0.5),
        bf16_linear(s, a + "v_proj.weight", kv, h, h**-0.5), bf16_linear(s, a + "o_proj.weight", h, q, q**-0.5),
        norm(s, a + "q_norm.weight", hd), norm(s, a + "k_norm.weight", hd),
        norm(s, p + "post_attention_layernorm.weight", h),
    ]
    if not moe:
        return out + _mlp(s, p + "mlp.", h, d["intermediate"])
    out.append(bf16_linear(s, p + "mlp.gate.weight", d["experts"], h, h**-0.5))
    for e in range(d["experts"]):
        out += _mlp(s, f"{p}mlp.experts.{e}.", h, d["moe_intermediate"])
    return out


def build_dense(d: dict, seed: int, layout: str, scale_fmt: str) -> Synth:
    """Qwen3 (family ``qwen3``)."""
    return build(d, seed, layout, scale_fmt, moe=False)


def build_moe(d: dict, seed: int, layout: str, scale_fmt: str) -> Synth:
    """Qwen3-MoE (family ``qwen3-moe``)."""
    return build(d, seed, layout, scale_fmt, moe=True)


def build(d: dict, seed: int, layout: str, scale_fmt: str, moe: bool) -> Synth:
    if layout != "root":
        raise ValueError(f"--layout {layout} applies to gpt-oss only; Qwen3 ships one layout")
    if scale_fmt != "float":
        raise ValueError("--scale-fmt applies to deepseek-v3 only (Qwen3 fine-tunes ship BF16)")
    tok = tokenizer(d)
    h, v = d["hidden"], d["vocab"]
    pieces = [bf16_linear(seed, "model.embed_tokens.weight", v, h, 1.0)]
    for n in range(d["layers"]):
        pieces += _layer(seed, d, n, moe)
    pieces += [norm(seed, "model.norm.weight", h), bf16_linear(seed, "lm_head.weight", v, h, h**-0.5)]
    return Synth(config(d, tok, moe), generation_config(tok), pieces, tok)
