"""transformers (5.x, no one here wrote it) accepts every tiny synthetic checkpoint: config, model
(MXFP4 and fine-grained FP8 dequantized on CPU), forward pass, tokenizer and chat template."""

from __future__ import annotations

import pytest
import torch

from quantkit.checkpoint import Checkpoint
from quantkit.formats import fp8_block, mxfp4

FAMILIES = ["gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe"]
TEXT = "Hello world, 12345 + 678 = ?"
SPECIALS = {  # strings of the released tokenizers (REFERENCE.md)
    "gpt-oss": ["<|start|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>", "<|startoftext|>"],
    "deepseek-v3": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
    "qwen3": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
    "qwen3-moe": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
}


def _load(path):
    from transformers import AutoConfig, AutoModelForCausalLM, FineGrainedFP8Config, Mxfp4Config

    cfg = AutoConfig.from_pretrained(path)
    quant = {"gpt_oss": Mxfp4Config(dequantize=True), "deepseek_v3": FineGrainedFP8Config(dequantize=True)}
    kw = {"quantization_config": quant[cfg.model_type]} if cfg.model_type in quant else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, output_loading_info=True, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_loads_and_runs(synth_dir, family: str) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    path = synth_dir(family)
    model, info = _load(path)
    ck = Checkpoint(path)
    assert not info["missing_keys"] and not info.get("mismatched_keys"), info
    mtp = f"model.layers.{ck.config['num_hidden_layers']}."
    unexpected = set(info["unexpected_keys"])
    if family == "deepseek-v3":  # transformers does not build the MTP layer; it must still be on disk
        assert unexpected and all(k.startswith(mtp) for k in unexpected), sorted(unexpected)[:5]
        assert f"{mtp}eh_proj.weight" in ck
    else:
        assert not unexpected, sorted(unexpected)[:5]
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], ck.config["vocab_size"])
    assert torch.isfinite(logits).all() and logits.float().std() > 0
    assert GenerationConfig.from_pretrained(path).eos_token_id is not None


def test_transformers_dequantizes_deepseek_fp8_as_deepseek_does(synth_dir) -> None:
    path = synth_dir("deepseek-v3")
    model, _ = _load(path)
    ck = Checkpoint(path)
    p = "model.layers.1."

    def deq(name: str) -> torch.Tensor:
        return fp8_block.dequantize_weight(ck.get(name), ck.get(name + "_scale_inv")).bfloat16()

    layer = model.model.layers[1]
    assert torch.equal(layer.self_attn.kv_b_proj.weight, deq(p + "self_attn.kv_b_proj.weight"))
    e = ck.config["n_routed_experts"]
    gate_up = torch.stack([torch.cat([deq(f"{p}mlp.experts.{x}.gate_proj.weight"), deq(f"{p}mlp.experts.{x}.up_proj.weight")])
                           for x in range(e)])
    assert torch.equal(layer.mlp.experts.gate_up_proj, gate_up)
    assert torch.equal(layer.mlp.gate.e_score_correction_bias, ck.get(p + "mlp.gate.e_score_correction_bias"))
    assert ck.get(p + "mlp.gate.e_score_correction_bias").dtype == torch.float32


def test_transformers_dequantizes_gpt_oss_mxfp4_as_the_lut_says(synth_dir) -> None:
    path = synth_dir("gpt-oss")
    model, _ = _load(path)
    ck = Checkpoint(path)
    x = "model.layers.1.mlp.experts."
    ref = mxfp4.decode(ck.get(x + "gate_up_proj_blocks"), ck.get(x + "gate_up_proj_scales"))  # [E, 2I, H]
    experts = model.model.layers[1].mlp.experts
    assert torch.equal(experts.gate_up_proj, ref.transpose(1, 2).bfloat16())  # transformers keeps [E, H, 2I]
    assert torch.equal(experts.gate_up_proj_bias, ck.get(x + "gate_up_proj_bias"))
    assert torch.equal(model.model.layers[0].self_attn.sinks, ck.get("model.layers.0.self_attn.sinks"))


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_round_trip_and_chat_template(synth_dir, family: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(synth_dir(family))
    specials = SPECIALS[family]
    text = f"{specials[0]}user: café 12345, ça va?\n  def f(x): return x**2 {specials[1]} ok"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text
    for s in specials:
        sid = tok.convert_tokens_to_ids(s)
        assert tok(s, add_special_tokens=False).input_ids == [sid] and sid != tok.unk_token_id
    assert all(i < len(tok) for i in ids)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "Hi" in chat and any(s in chat for s in specials)
    if family == "deepseek-v3":
        assert tok("x").input_ids[0] == tok.convert_tokens_to_ids("<｜begin▁of▁sentence｜>") == 0
