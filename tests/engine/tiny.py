"""Tiny checkpoints made by transformers itself (config built offline, seeded random weights,
``save_pretrained`` in BF16 like the sources), and the transformers reference run on them.

Weights are re-drawn at O(1) scale (transformers' init, std 0.02, would leave every logit near
zero and every router near uniform, so nothing would be tested): matrices N(0, 0.125^2), norms
1 + N(0, 0.1^2), biases / sinks / DeepSeek's correction bias N(0, 0.1^2)-ish.  GPT-OSS's
swiglu_limit is lowered so that the clamp is active on both sides.

:func:`requantize` writes a quantized copy (fp8-block, its ue8m0 variant, mxfp8, MXFP4 experts)
under the on-disk names the engine reads, plus the same weights dequantized in F32 for transformers.
"""

from __future__ import annotations

from pathlib import Path

import torch

CONFIGS: dict[str, tuple[str, dict]] = {
    "gpt-oss": ("GptOss", dict(
        vocab_size=128, hidden_size=64, intermediate_size=32, head_dim=16, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=4, max_position_embeddings=4096, swiglu_limit=1.5,
    )),
    "deepseek-v3": ("DeepseekV3", dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=3, first_k_dense_replace=1, n_shared_experts=1, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, max_position_embeddings=163840,
        routed_scaling_factor=2.5, rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=40.0, beta_fast=32.0, beta_slow=1.0,
            mscale=1.0, mscale_all_dim=0.8, original_max_position_embeddings=4096),
    )),
    # no q_lora (q_proj), half-split RoPE, no YaRN
    "deepseek-v3-plain": ("DeepseekV3", dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, n_group=1, topk_group=1,
        num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, kv_lora_rank=32, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, rope_interleave=False, norm_topk_prob=False,
    )),
    "qwen3": ("Qwen3", dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, head_dim=32, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, tie_word_embeddings=True, use_sliding_window=True,
        sliding_window=4, max_window_layers=1,
    )),
    "qwen3-moe": ("Qwen3Moe", dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
    )),
}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if not t.is_floating_point() or "inv_freq" in name:
            continue
        r = torch.randn(t.shape, generator=g)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            r = 1 + 0.1 * r
        elif name.endswith(("bias", "sinks", "e_score_correction_bias")):
            r = 0.1 * r
        elif name.endswith("embed_tokens.weight"):
            pass
        else:
            r = 0.125 * r
        t.data.copy_(r.to(t.dtype))


def make_tiny(kind: str, dst: Path, seed: int = 0) -> Path:
    """Save a tiny random transformers model of ``kind`` (a CONFIGS key) to ``dst`` in BF16."""
    import transformers

    prefix, kw = CONFIGS[kind]
    config = getattr(transformers, prefix + "Config")(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, prefix + "ForCausalLM")(config)
    _randomize(model, seed)
    model.to(torch.bfloat16).save_pretrained(dst)
    return dst


def hf_model(path: Path, **kw):
    """The transformers reference, float32, eager attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", **kw).eval()


@torch.no_grad()
def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids[None]).logits[0].float()


def token_ids(n: int, vocab: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


QUANT_CONFIGS = {
    "fp8-block": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
    "fp8-block-ue8m0": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
    "mxfp8": {"quant_method": "compressed-tensors", "format": "mxfp8-quantized"},
    "mxfp4": {"quant_method": "mxfp4"},
}


def _quantize(name: str, w: torch.Tensor, fmt: str, fused: bool) -> dict[str, torch.Tensor]:
    """One weight in ``fmt`` under its on-disk names; fused GPT-OSS experts arrive as [E, in, out]."""
    from quantkit.formats import fp8_block, mxfp4, mxfp8

    w = w.float().transpose(-1, -2).contiguous() if fused else w.float()  # -> out x in
    sfx = "" if fused else ".weight"
    base = name if fused else name[: -len(".weight")]
    if fmt.startswith("fp8-block"):
        q, s = fp8_block.quantize_weight(w, "ue8m0" if fmt.endswith("ue8m0") else "float")
        deq = fp8_block.dequantize_weight(q, s)
        out = {base + sfx: q, base + sfx + "_scale_inv": s}
    elif fmt == "mxfp8":
        q, s = mxfp8.quantize(w)
        deq = mxfp8.dequantize(q, s)
        out = {base + sfx: q, base + sfx + "_scale": s}
    else:
        b, s = mxfp4.encode(w)
        deq = mxfp4.decode(b, s)
        out = {base + "_blocks": b, base + "_scales": s}
    out["dequantized"] = deq.transpose(-1, -2) if fused else deq
    return out


def requantize(src: Path, dst: Path, fmt: str, mxfp4_experts_only: bool = False) -> tuple[Path, Path]:
    """Quantize every linear weight of ``src`` (families.is_quantized_weight) to ``fmt`` in ``dst``;
    also write ``dst``-dequant: the same weights dequantized, F32, in transformers' layout."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from quantkit import families

    cfg = json.loads((src / "config.json").read_text())
    fam = families.detect(cfg)
    qt, dq = {}, {}
    for name, t in load_file(src / "model.safetensors").items():
        fused = fam.fused_experts and ".mlp.experts." in name and not name.endswith("_bias")
        if families.is_quantized_weight(fam, name) and not (mxfp4_experts_only and not fused):
            out = _quantize(name, t, fmt, fused)
            dq[name] = out.pop("dequantized")
            qt.update(out)
        else:
            qt[name], dq[name] = t, t.float()
    deq = dst.with_name(dst.name + "-dequant")
    for d, tensors in ((dst, qt), (deq, dq)):
        d.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, d / "model.safetensors")
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": QUANT_CONFIGS[fmt]}))
    shutil.copy(src / "config.json", deq / "config.json")
    return dst, deq
