"""Output names, dtypes, shapes, config and manifest of every family x target, checked against the
conventions in DESIGN.md / REFERENCE.md (DeepSeek's official layout is the synthetic source's)."""

from __future__ import annotations

import hashlib
import json
from math import ceil

import pytest

from quantkit.checkpoint import Checkpoint

from .support import edit_config, header, run, copy_ckpt


def test_deepseek_fp8_block_has_the_official_names_dtypes_and_scale_shapes(synth, tmp_path) -> None:
    src = synth("deepseek-v3", "tiny-ragged")
    official = header(src)
    # through bf16 and back: every FP8 weight and scale is re-created, not copied
    run(src, tmp_path / "bf16", to="bf16")
    run(tmp_path / "bf16", tmp_path / "fp8", to="fp8-block")
    assert header(tmp_path / "fp8") == official
    cfg = json.loads((src / "config.json").read_text())
    L = cfg["num_hidden_layers"]
    kv_a = official["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"]
    rows = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    assert kv_a == ("F32", [ceil(rows / 128), ceil(cfg["hidden_size"] / 128)])
    # the MTP layer is kept, with its BF16 eh_proj / shared_head and an FP8 decoder layer
    assert official[f"model.layers.{L}.eh_proj.weight"][0] == "BF16"
    assert official[f"model.layers.{L}.shared_head.head.weight"][0] == "BF16"
    assert official[f"model.layers.{L}.mlp.experts.0.down_proj.weight"][0] == "F8_E4M3"
    assert official[f"model.layers.{L}.mlp.gate.e_score_correction_bias"][0] == "F32"


def test_deepseek_mxfp8_names(synth, tmp_path) -> None:
    src = synth("deepseek-v3")
    run(src, tmp_path / "o", to="mxfp8")
    h = header(tmp_path / "o")
    w = h["model.layers.1.mlp.experts.3.gate_proj.weight"]
    assert w[0] == "F8_E4M3"
    assert h["model.layers.1.mlp.experts.3.gate_proj.weight_scale"] == ("U8", [w[1][0], w[1][1] // 32])
    assert not any(k.endswith("_scale_inv") for k in h)
    assert h["model.layers.1.mlp.gate.weight"][0] == "BF16"
    qc = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "mxfp8-quantized"
    g = qc["config_groups"]["group_0"]
    assert g["weights"]["group_size"] == 32 and g["weights"]["scale_dtype"] == "torch.uint8" and not g["weights"]["dynamic"]
    assert g["input_activations"]["dynamic"] and g["targets"] == ["Linear"]
    assert "lm_head" in qc["ignore"] and "model.layers.1.mlp.gate" in qc["ignore"]


@pytest.mark.parametrize("to", ["fp8-block", "mxfp8", "bf16"])
def test_gpt_oss_fused_expert_names_and_orientation(synth, tmp_path, to) -> None:
    src = synth("gpt-oss", "tiny-ragged")
    cfg = json.loads((src / "config.json").read_text())
    E, H, I = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    run(src, tmp_path / "o", to=to)
    h = header(tmp_path / "o")
    p = "model.layers.1.mlp.experts."
    assert not any(k.endswith(("_blocks", "_scales")) for k in h)
    assert h[p + "gate_up_proj_bias"] == ("BF16", [E, 2 * I]) and h[p + "down_proj_bias"] == ("BF16", [E, H])
    if to == "bf16":  # as transformers saves it: [E, in, out]
        assert h[p + "gate_up_proj"] == ("BF16", [E, H, 2 * I])
        assert h[p + "down_proj"] == ("BF16", [E, I, H])
        return
    assert h[p + "gate_up_proj"] == ("F8_E4M3", [E, 2 * I, H])  # out x in, interleave kept
    assert h[p + "down_proj"] == ("F8_E4M3", [E, H, I])
    if to == "fp8-block":
        assert h[p + "gate_up_proj_scale_inv"] == ("F32", [E, ceil(2 * I / 128), ceil(H / 128)])
        assert h[p + "down_proj_scale_inv"] == ("F32", [E, ceil(H / 128), ceil(I / 128)])
        assert h["model.layers.0.self_attn.q_proj.weight_scale_inv"][0] == "F32"  # attention runs FP8-block too
    else:
        assert h[p + "gate_up_proj_scale"] == ("U8", [E, 2 * I, H // 32])
        assert h[p + "down_proj_scale"] == ("U8", [E, H, I // 32])
    for keep in ("model.layers.0.mlp.router.weight", "model.layers.0.self_attn.sinks", "model.embed_tokens.weight", "lm_head.weight"):
        assert h[keep][0] != "F8_E4M3", keep


def test_gpt_oss_original_layout_gives_the_root_layout_bytes(synth, tmp_path) -> None:
    root, orig = synth("gpt-oss"), synth("gpt-oss", layout="original")
    assert not list(orig.glob("*.safetensors"))
    run(root, tmp_path / "a", to="fp8-block")
    run(orig, tmp_path / "b", to="fp8-block")
    for f in sorted((tmp_path / "a").glob("*.safetensors")):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name
    manifest = json.loads((tmp_path / "b" / "quantkit.json").read_text())
    assert manifest["source"]["layout"] == "original"
    # the original/ folder alone (its own config.json mapped to an HF one) converts the same
    run(orig / "original", tmp_path / "c", to="fp8-block")
    assert sorted(header(tmp_path / "c")) == sorted(header(tmp_path / "a"))
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    assert cfg["architectures"] == ["GptOssForCausalLM"] and cfg["num_local_experts"] == 8


def test_qwen3_moe_per_expert_names_and_fp8_config(synth, tmp_path) -> None:
    src = synth("qwen3-moe")
    run(src, tmp_path / "o", to="fp8-block")
    h = header(tmp_path / "o")
    for e in range(8):
        for n in ("gate_proj", "up_proj", "down_proj"):
            w = h[f"model.layers.0.mlp.experts.{e}.{n}.weight"]
            assert w[0] == "F8_E4M3"
            assert h[f"model.layers.0.mlp.experts.{e}.{n}.weight_scale_inv"] == ("F32", [ceil(w[1][0] / 128), ceil(w[1][1] / 128)])
    assert h["model.layers.0.mlp.gate.weight"][0] == "BF16" and h["lm_head.weight"][0] == "BF16"
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}


def test_ue8m0_and_bf16_configs(synth, tmp_path) -> None:
    run(synth("qwen3"), tmp_path / "u", to="fp8-block", scale_fmt="ue8m0")
    assert json.loads((tmp_path / "u" / "config.json").read_text())["quantization_config"]["scale_fmt"] == "ue8m0"
    run(synth("deepseek-v3"), tmp_path / "b", to="bf16")
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["architectures"] == ["DeepseekV3ForCausalLM"]


def test_fine_tune_config_with_extra_fields_passes_through(synth, tmp_path) -> None:
    src = copy_ckpt(synth("qwen3"), tmp_path / "ft")
    edit_config(src, lambda c: c.update(my_finetune_note="lora r=16 merged", use_sliding_window=False, rope_scaling=None, torch_dtype="bfloat16"))
    run(src, tmp_path / "o", to="fp8-block")
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["my_finetune_note"] == "lora r=16 merged" and cfg["quantization_config"]["quant_method"] == "fp8"


def test_ignore_keeps_weights_and_lists_them(synth, tmp_path) -> None:
    run(synth("qwen3"), tmp_path / "o", to="fp8-block", ignore=("model.layers.1.mlp.*", "*.self_attn.o_proj"))
    h = header(tmp_path / "o")
    assert h["model.layers.1.mlp.down_proj.weight"][0] == "BF16" and "model.layers.1.mlp.down_proj.weight_scale_inv" not in h
    assert h["model.layers.0.self_attn.o_proj.weight"][0] == "BF16"
    assert h["model.layers.0.mlp.down_proj.weight"][0] == "F8_E4M3"
    kept = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]["modules_to_not_convert"]
    assert set(kept) == {"model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj",
                         "model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"}


def test_manifest_records_options_fingerprint_files_and_fidelity(synth, tmp_path) -> None:
    src = synth("gpt-oss")
    rep = run(src, tmp_path / "o", to="mxfp8", rounding="stochastic", seed=7)
    m = json.loads((tmp_path / "o" / "quantkit.json").read_text())
    assert m["source"]["fingerprint"] == Checkpoint(src).fingerprint() and m["source"]["family"] == "gpt-oss"
    assert m["options"]["to"] == "mxfp8" and m["options"]["seed"] == 7 and m["options"]["scale_rule"] == "rceil"
    assert m["options"]["rounding_hash"] == "lowbias32x1-u20"  # the stream that made the bytes (formats/rounding.py)
    for name, digest in m["files"].items():
        assert hashlib.sha256((tmp_path / "o" / name).read_bytes()).hexdigest() == digest, name
    assert "config.json" in m["files"] and "tokenizer.json" in m["files"]
    t = m["tensors"]
    assert t["model.layers.0.mlp.experts.gate_up_proj"]["path"] == "mxfp4->mxfp8"
    assert t["model.layers.0.mlp.experts.gate_up_proj"]["exact_path"] is True
    q = t["model.layers.0.self_attn.q_proj.weight"]
    assert q["path"] == "quantize" and not q["exact_path"] and 0 < q["rel_err"] < 0.1 and q["exact_share"] < 1
    assert set(t) == {task for task in header(src) if not task.endswith(("_blocks", "_scales"))} | {
        f"model.layers.{i}.mlp.experts.{n}" for i in range(2) for n in ("gate_up_proj", "down_proj")}
    assert rep["note"].startswith("exact paths (mxfp4->mxfp8) round nothing")
