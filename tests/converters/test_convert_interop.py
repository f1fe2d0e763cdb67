"""transformers (5.x, CPU) is the judge: it loads our fp8-block outputs of Qwen3 / Qwen3-MoE by
dequantizing them, and our bf16 outputs of every family, and computes what the sources compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantkit.formats import fp8_block

from .support import run, tensors

TOKENS = torch.tensor([[1, 5, 9, 200, 17, 3, 1000, 42, 7, 11, 64, 128]])


def load(path: Path, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kw).eval()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS).logits.float()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe"])
def test_transformers_loads_our_fp8_block(synth, tmp_path, family) -> None:
    src = synth(family)
    run(src, tmp_path / "o", to="fp8-block")
    ours, base = load(tmp_path / "o"), load(src)
    # its dequantized weights are DeepSeek's rule applied to our bytes, bit for bit
    o = tensors(tmp_path / "o")
    name = "model.layers.1.self_attn.q_proj.weight"
    want = fp8_block.dequantize_weight(o[name], o[name + "_scale_inv"]).to(torch.bfloat16)
    assert torch.equal(ours.get_parameter(name), want)
    if family == "qwen3-moe":  # transformers fuses the per-expert weights: gate_up_proj [E, 2I, H] = [gate | up]
        p = "model.layers.0.mlp.experts.3."
        gate = fp8_block.dequantize_weight(o[p + "gate_proj.weight"], o[p + "gate_proj.weight_scale_inv"])
        fused = ours.model.layers[0].mlp.experts.gate_up_proj[3]
        assert torch.equal(fused[: gate.shape[0]], gate.to(torch.bfloat16))
    # logits within what FP8 implies: a few times the weights' own relative error
    worst = max(t["rel_err"] for t in json.loads((tmp_path / "o" / "quantkit.json").read_text())["tensors"].values())
    assert 0 < worst < 0.05
    err = rel(logits(ours), logits(base))
    assert err < 5 * worst, f"logits rel. error {err:.4f} vs weight rel. error {worst:.4f}"


def test_gpt_oss_bf16_equals_transformers_mxfp4_dequantization_in_the_model(synth, tmp_path) -> None:
    from transformers import Mxfp4Config

    src = synth("gpt-oss")
    run(src, tmp_path / "o", to="bf16")
    ours, base = load(tmp_path / "o"), load(src, quantization_config=Mxfp4Config(dequantize=True))
    theirs = dict(base.named_parameters())
    for name, p in ours.named_parameters():
        assert p.dtype == theirs[name].dtype and torch.equal(p, theirs[name]), name
    assert torch.equal(logits(ours), logits(base))


def test_deepseek_bf16_equals_transformers_fp8_dequantization(synth, tmp_path) -> None:
    src = synth("deepseek-v3")  # 128-aligned: transformers' CPU dequantizer rejects partial tiles
    run(src, tmp_path / "o", to="bf16")
    ours, base = load(tmp_path / "o"), load(src)
    theirs = dict(base.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.equal(p, theirs[name].to(p.dtype)), name
    out = logits(ours)
    assert torch.isfinite(out).all() and torch.equal(out, logits(base))


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe"])
def test_qwen_bf16_loads(synth, tmp_path, family) -> None:
    src = synth(family, "tiny-ragged")
    run(src, tmp_path / "o", to="bf16")
    assert torch.equal(logits(load(tmp_path / "o")), logits(load(src)))


def test_gpt_oss_from_the_original_folder_alone_loads(synth, tmp_path) -> None:
    """The HF config mapped from original/config.json builds the same transformers model."""
    orig = synth("gpt-oss", layout="original")
    run(orig / "original", tmp_path / "a", to="bf16")
    run(synth("gpt-oss"), tmp_path / "b", to="bf16")
    assert torch.equal(logits(load(tmp_path / "a")), logits(load(tmp_path / "b")))
