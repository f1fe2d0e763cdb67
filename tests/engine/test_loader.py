"""Loading quantized checkpoints: each weight's format is read off its tensors, and with
activations unquantized the engine computes exactly what transformers computes on the
dequantized weights (same bound as test_faithfulness).  Bad checkpoints fail with a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.checkpoint import CheckpointError
from quantkit.engine import load, prefill_logits
from quantkit.engine.qlinear import Fp8Block, QWeight

from .test_faithfulness import SEQS, assert_logits_close
from .tiny import hf_logits, hf_model, requantize

CASES = [  # kind, format, quantize only the fused experts (the MXFP4 source layout)
    ("gpt-oss", "mxfp4", True),
    ("gpt-oss", "fp8-block", False),
    ("gpt-oss", "mxfp8", False),
    ("deepseek-v3", "fp8-block", False),
    ("deepseek-v3", "fp8-block-ue8m0", False),
    ("qwen3-moe", "mxfp8", False),
]


def _formats(model: torch.nn.Module) -> set[str]:
    return {m.fmt for m in model.modules() if isinstance(m, QWeight)}


@pytest.mark.parametrize(("kind", "fmt", "experts_only"), CASES, ids=[f"{k}-{f}" for k, f, _ in CASES])
def test_quantized_equals_transformers_on_dequantized(tiny, tmp_path: Path, kind: str, fmt: str, experts_only: bool) -> None:
    q, deq = requantize(tiny(kind), tmp_path / fmt, fmt, experts_only)
    model = load(q, dtype=torch.float32, act_quant=False)
    assert _formats(model) == {fmt.removesuffix("-ue8m0"), "dense"}
    ref = hf_model(deq)
    for i, (s, o) in enumerate(zip(SEQS, prefill_logits(model, SEQS), strict=True)):
        assert_logits_close(o, hf_logits(ref, s), f"{kind} {fmt} sequence {i}")


@pytest.mark.parametrize(("fmt", "scale_fmt"), [("fp8-block", "float"), ("fp8-block-ue8m0", "ue8m0")])
def test_act_quant_follows_the_checkpoint(tiny, tmp_path: Path, fmt: str, scale_fmt: str) -> None:
    q, _ = requantize(tiny("deepseek-v3"), tmp_path / fmt, fmt)
    served = load(q, dtype=torch.float32)
    acts = {m.act for m in served.modules() if isinstance(m, Fp8Block)}
    assert {(a.kind, a.scale_fmt) for a in acts} == {("fp8-block", scale_fmt)}
    a = prefill_logits(served, SEQS[:1])[0]
    b = prefill_logits(load(q, dtype=torch.float32, act_quant=False), SEQS[:1])[0]
    assert served.ops.ran["act_quant_fp8_block"] == "torch"
    assert 0 < (a - b).abs().max().item() < 0.5 * b.abs().max().item()


def _edit(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    ts = load_file(dst / "model.safetensors")
    edit(ts)
    save_file(ts, dst / "model.safetensors")
    return dst


def test_bad_checkpoints_fail_loudly(tiny, tmp_path: Path) -> None:
    src = tiny("qwen3")
    q = "model.layers.0.self_attn.q_proj.weight"
    extra = _edit(src, tmp_path / "extra", lambda ts: ts.update({"model.layers.0.mystery": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="tensor 'model.layers.0.mystery' is not one the config implies for qwen3"):
        load(extra)
    missing = _edit(src, tmp_path / "missing", lambda ts: ts.pop(q))
    with pytest.raises(CheckpointError, match="tensor 'model.layers.0.self_attn.q_proj.weight' is missing; the config implies"):
        load(missing)
    unscaled = _edit(src, tmp_path / "unscaled", lambda ts: ts.update({q: ts[q].float().to(torch.float8_e4m3fn)}))
    with pytest.raises(CheckpointError, match="is F8_E4M3 but has no .*weight_scale_inv"):
        load(unscaled)
    other = shutil.copytree(src, tmp_path / "other")
    (other / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="LlamaForCausalLM.*not supported"):
        load(other)
    orig = tmp_path / "orig"
    (orig / "original").mkdir(parents=True)
    shutil.copy(src / "model.safetensors", orig / "original" / "model.safetensors")
    with pytest.raises(CheckpointError, match="original/"):
        load(orig)
