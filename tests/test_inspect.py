"""``quantkit inspect``: formats are read off the tensors; every kind of problem is reported and exits 1."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from quantkit.cli import main
from quantkit.formats import fp8_block, mxfp4, mxfp8

# the tensors below are a fragment of a layer, not a model: the config's problems (missing keys and
# tensors) are not what these tests are about, so they are set aside by _tensor_problems
CFG = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 32, "hidden_size": 256, "num_hidden_layers": 1}


def _ckpt(d: Path, ts: dict[str, torch.Tensor], cfg: dict = CFG) -> Path:
    d.mkdir()
    save_file(ts, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(384, 256, generator=g)
    q, s = fp8_block.quantize_weight(w)
    qe, se = fp8_block.quantize_weight(w, scale_fmt="ue8m0")
    q8, s8 = mxfp8.quantize(w)
    return {
        "model.embed_tokens.weight": torch.randn(32, 256, generator=g).bfloat16(),
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.q_proj.weight_scale_inv": s,
        "model.layers.0.self_attn.k_proj.weight": qe,
        "model.layers.0.self_attn.k_proj.weight_scale_inv": se,
        "model.layers.0.self_attn.v_proj.weight": q8,
        "model.layers.0.self_attn.v_proj.weight_scale": s8,
        "model.layers.0.self_attn.o_proj.weight": w.bfloat16(),
        "model.layers.0.input_layernorm.weight": torch.ones(256).bfloat16(),
    }


def _run(d: Path) -> tuple[int, dict]:
    r = CliRunner().invoke(main, ["inspect", str(d), "--json", "--tensors"])
    return r.exit_code, json.loads(r.output)


def _tensor_problems(rep: dict) -> list[str]:
    return [p for p in rep["problems"] if "config" not in p]


def test_formats_are_named_like_convert_targets(tmp_path: Path) -> None:
    code, rep = _run(_ckpt(tmp_path / "c", _base()))
    assert _tensor_problems(rep) == [], rep["problems"]
    assert rep["family"] == "qwen3"
    assert rep["formats"] == {"bf16": 1, "fp8-block": 1, "fp8-block-ue8m0": 1, "mxfp8": 1}
    assert rep["parameters"] == 32 * 256 + 4 * 384 * 256 + 256
    assert rep["quantized"] == 3


def test_mxfp4_blocks_count_two_params_per_byte(tmp_path: Path) -> None:
    ts = _base()
    b, s = mxfp4.encode(torch.randn(2, 64, 256))
    ts |= {"model.layers.0.mlp.experts.gate_up_proj_blocks": b, "model.layers.0.mlp.experts.gate_up_proj_scales": s}
    code, rep = _run(_ckpt(tmp_path / "c", ts))
    assert _tensor_problems(rep) == [] and rep["formats"]["mxfp4"] == 1
    assert rep["parameters"] == 32 * 256 + 4 * 384 * 256 + 256 + 2 * 64 * 256


def _problem(tmp_path: Path, ts: dict, pattern: str, cfg: dict = CFG) -> None:
    code, rep = _run(_ckpt(tmp_path / "c", ts, cfg))
    assert code == 1
    assert any(pattern in p for p in rep["problems"]), rep["problems"]


def test_missing_scale(tmp_path: Path) -> None:
    ts = _base()
    del ts["model.layers.0.self_attn.q_proj.weight_scale_inv"]
    _problem(tmp_path, ts, "q_proj.weight: F8_E4M3 weight without a weight_scale_inv")


def test_scale_shape_disagrees(tmp_path: Path) -> None:
    ts = _base()
    ts["model.layers.0.self_attn.q_proj.weight_scale_inv"] = torch.ones(2, 2)
    _problem(tmp_path, ts, "disagrees with weight [384, 256] (want [3, 2]")


def test_orphan_scale(tmp_path: Path) -> None:
    ts = _base()
    ts["model.layers.0.mlp.up_proj.weight_scale_inv"] = torch.ones(1, 1)
    _problem(tmp_path, ts, "scale without its weight")


def test_mx_k_not_multiple_of_32(tmp_path: Path) -> None:
    ts = _base()
    ts["model.layers.0.mlp.up_proj.weight"] = torch.zeros(8, 40).to(torch.float8_e4m3fn)
    ts["model.layers.0.mlp.up_proj.weight_scale"] = torch.zeros(8, 1, dtype=torch.uint8)
    _problem(tmp_path, ts, "K=40, not a multiple of 32")


def _synth_with(tmp_path: Path, **cfg) -> Path:
    from quantkit.synth import synthesize

    d = tmp_path / "c"
    synthesize("qwen3", d, preset="tiny")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(config | cfg))
    return d


def test_shape_disagrees_with_config(tmp_path: Path) -> None:
    code, rep = _run(_synth_with(tmp_path, vocab_size=4096))
    assert code == 1 and "tensor 'model.embed_tokens.weight' has shape [2048, 256]; the config implies [4096, 256]" in rep["problems"]


def test_layer_count_disagrees_with_config(tmp_path: Path) -> None:
    code, rep = _run(_synth_with(tmp_path, num_hidden_layers=3))
    assert code == 1 and rep["problems"] == ["layers 0..1 (2) in the tensors, but the config says 3 (num_hidden_layers)"]


def test_unknown_architecture(tmp_path: Path) -> None:
    _problem(tmp_path, _base(), "is not supported; supported:", CFG | {"architectures": ["LlamaForCausalLM"]})


def test_unreadable_checkpoint_is_a_clean_error(tmp_path: Path) -> None:
    d = _ckpt(tmp_path / "c", _base())
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[:100])
    r = CliRunner().invoke(main, ["inspect", str(d)])
    assert r.exit_code == 1 and "Error:" in r.output and "model.safetensors" in r.output
    assert "Traceback" not in r.output


def test_synth_checkpoints_of_every_family_are_clean(tmp_path: Path) -> None:
    from quantkit.synth import synthesize

    cases = [("gpt-oss", "root", "mxfp4"), ("gpt-oss", "original", "mxfp4"), ("deepseek-v3", "root", "fp8-block"), ("qwen3-moe", "root", "bf16")]
    for fam, layout, fmt in cases:
        d = tmp_path / f"{fam}-{layout}"
        synthesize(fam, d, preset="tiny", layout=layout)
        code, rep = _run(d)
        assert code == 0, rep["problems"]
        assert rep["family"] == fam and fmt in rep["formats"], rep["formats"]


def test_compressed_tensors_weights_are_named(tmp_path: Path) -> None:
    # compressed-tensors stores FP8 per channel / per tensor with a float weight_scale, MXFP4 as
    # weight_packed [N, K/2] + U8 weight_scale [N, K/32], and static FP8 an input_scale (an activation's)
    w = torch.randn(384, 256)
    q = w.clamp(-448, 448).to(torch.float8_e4m3fn)
    b, s = mxfp4.encode(w)
    ts = _base() | {
        "model.layers.0.self_attn.q_proj.weight": q, "model.layers.0.self_attn.q_proj.weight_scale": torch.ones(384, 1).bfloat16(),
        "model.layers.0.self_attn.k_proj.weight": q.clone(), "model.layers.0.self_attn.k_proj.weight_scale": torch.ones(1),
        "model.layers.0.self_attn.k_proj.input_scale": torch.ones(1),
        "model.layers.0.self_attn.o_proj.weight_packed": b.reshape(384, 128), "model.layers.0.self_attn.o_proj.weight_scale": s,
    }
    for k in ("model.layers.0.self_attn.q_proj.weight_scale_inv", "model.layers.0.self_attn.k_proj.weight_scale_inv", "model.layers.0.self_attn.o_proj.weight"):
        del ts[k]
    code, rep = _run(_ckpt(tmp_path / "c", ts))
    assert _tensor_problems(rep) == [], rep["problems"]
    assert rep["formats"] == {"fp8-channel": 1, "fp8-tensor": 1, "mxfp4": 1, "mxfp8": 1}
    assert rep["parameters"] == 32 * 256 + 4 * 384 * 256 + 256 and rep["warnings"] == []


def test_warns_where_transformers_refuses_partial_fp8_tiles(tmp_path: Path) -> None:
    ts = _base()
    q, s = fp8_block.quantize_weight(torch.randn(320, 192))
    ts |= {"model.layers.0.mlp.down_proj.weight": q, "model.layers.0.mlp.down_proj.weight_scale_inv": s}
    code, rep = _run(_ckpt(tmp_path / "c", ts))
    assert _tensor_problems(rep) == [] and len(rep["warnings"]) == 1, rep["warnings"]  # a warning, not a problem
    w = rep["warnings"][0]
    assert "transformers 5.24" in w and "1 fp8-block weight(s)" in w and "Weight shape (320, 192) not divisible by scale grid (3, 2)" in w
    code, rep = _run(_ckpt(tmp_path / "aligned", _base()))
    assert rep["warnings"] == []


def test_warns_where_transformers_refuses_compressed_tensors_experts(tmp_path: Path) -> None:
    q8, s8 = mxfp8.quantize(torch.randn(128, 256))
    experts = {f"model.layers.0.mlp.experts.{e}.{p}_proj.{n}": t for e in range(2) for p in ("gate", "up") for n, t in (("weight", q8.clone()), ("weight_scale", s8.clone()))}
    moe = CFG | {"architectures": ["Qwen3MoeForCausalLM"], "quantization_config": {"quant_method": "compressed-tensors"}}
    _, rep = _run(_ckpt(tmp_path / "ct", _base() | experts, moe))
    assert len(rep["warnings"]) == 1 and "compressed-tensors MoE checkpoint (4 quantized expert tensors" in rep["warnings"][0]
    _, rep = _run(_ckpt(tmp_path / "hf", _base() | experts, CFG | {"architectures": ["Qwen3MoeForCausalLM"]}))
    assert rep["warnings"] == []  # the rule is about compressed-tensors' loader
