"""The engine on ``quantkit synth`` checkpoints (exact upstream layouts) and ``quantkit convert`` outputs.

* tiny presets, source formats (GPT-OSS MXFP4 experts, DeepSeek FP8 blocks, Qwen BF16): engine
  logits (activations unquantized) equal transformers' (which dequantizes on CPU), same bound as
  test_faithfulness.
* DeepSeek tiny-ragged (partial 128-tiles, which transformers' CPU dequantizer rejects): judged on
  our bf16 conversion, which the engine must read as transformers does; the FP8 source itself is
  read by DeepSeek's tile rule, so its weights equal the bf16 ones to bf16 rounding.
* every convert target loads, each weight dequantizing to the source's weight within the
  target's precision (a layout mistake — transposition, interleave, scale grid — is an O(1) error).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from quantkit.engine import load, prefill_logits
from quantkit.engine.qlinear import QWeight

from .test_faithfulness import assert_logits_close
from .tiny import hf_logits, hf_model

FAMILIES = ["gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe"]
IDS = torch.randint(0, 1900, (12,), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory):
    """made(family, preset) / made(family, preset, to=FORMAT): synth (and convert) once per module, removed after it."""
    from quantkit.converters import ConvertOptions, convert
    from quantkit.synth import synthesize

    root, done = tmp_path_factory.mktemp("synth"), {}

    def get(family: str, preset: str = "tiny", to: str | None = None) -> Path:
        key = (family, preset, to)
        if key not in done:
            src = root / f"{family}-{preset}"
            if not src.exists():
                synthesize(family, src, preset=preset)
            if to is not None:
                convert(src, root / f"{family}-{preset}-{to}", ConvertOptions(to=to))
            done[key] = src if to is None else root / f"{family}-{preset}-{to}"
        return done[key]

    yield get
    shutil.rmtree(root, ignore_errors=True)


def _dequantize_kw(family: str) -> dict:
    from transformers import FineGrainedFP8Config, Mxfp4Config

    return {"gpt-oss": {"quantization_config": Mxfp4Config(dequantize=True)},
            "deepseek-v3": {"quantization_config": FineGrainedFP8Config(dequantize=True)}}.get(family, {})


@pytest.mark.parametrize("family", FAMILIES)
def test_synth_tiny_matches_transformers(made, family: str) -> None:
    path = made(family)
    ours = prefill_logits(load(path, dtype=torch.float32, act_quant=False), [IDS])[0]
    assert_logits_close(ours, hf_logits(hf_model(path, **_dequantize_kw(family)), IDS), f"synth {family}")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    """Every packed weight of the engine model, dequantized (float32 [E?, N, K])."""
    model = load(path, dtype=torch.float32, act_quant=False)
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, QWeight):
            out[name] = m.dequant() if m.num_experts is None else torch.stack([m.dequant(e) for e in range(m.num_experts)])
    return out


def _assert_weights_close(got: dict, want: dict, rel: float, exact: str | None = None) -> None:
    """Relative error of every weight <= rel; 0 for names containing ``exact`` (an exact conversion path)."""
    assert got.keys() == want.keys()
    for name, w in want.items():
        err = ((got[name] - w).norm() / w.norm()).item()
        bound = 0.0 if exact is not None and exact in name else rel
        assert err <= bound, f"{name}: relative error {err:.3g} > {bound}"


def test_ragged_deepseek_via_bf16_conversion(made) -> None:
    src, bf16 = made("deepseek-v3", "tiny-ragged"), made("deepseek-v3", "tiny-ragged", to="bf16")
    ours = prefill_logits(load(bf16, dtype=torch.float32), [IDS])[0]
    assert_logits_close(ours, hf_logits(hf_model(bf16), IDS), "deepseek tiny-ragged bf16")
    _assert_weights_close(_weights(src), _weights(bf16), rel=2**-8)


@pytest.mark.parametrize(("family", "preset", "to", "exact"), [
    ("gpt-oss", "tiny", "mxfp8", "experts"),  # MXFP4 -> MXFP8 is exact; attention is requantized from BF16
    ("gpt-oss", "tiny-ragged", "fp8-block", None),  # H = 320, 2I = 384: partial 128-tiles in fused experts
    ("deepseek-v3", "tiny", "mxfp8", None),
    ("qwen3-moe", "tiny", "fp8-block", None),
    ("qwen3-moe", "tiny", "mxfp8", None),
])
def test_converted_outputs_load(made, family: str, preset: str, to: str, exact: str | None) -> None:
    out = made(family, preset, to=to)
    _assert_weights_close(_weights(out), _weights(made(family, preset)), 2**-4, exact)
    model = load(out, dtype=torch.float32)
    assert to in {m.fmt for m in model.modules() if isinstance(m, QWeight)}
    assert torch.isfinite(prefill_logits(model, [IDS])[0]).all()
