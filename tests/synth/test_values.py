"""Values of synthetic checkpoints: deterministic by seed, never zero or constant, with the scale
spread and outliers that make quantization non-trivial; FP8 tiles follow DeepSeek's rule."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quantkit.checkpoint import Checkpoint
from quantkit.formats import mxfp4
from quantkit.synth import synthesize, weights

FAMILIES = ["gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe"]
E4M3_MAX = 448.0


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "quantkit.json"}


def deepseek_dequant(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """DeepSeek inference/kernel.py weight_dequant: element (i, j) times s[i // 128, j // 128]."""
    m, n = q.shape
    return q.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:m, :n]


def _dequantized(ck: Checkpoint) -> dict[str, torch.Tensor]:
    """Every weight-like tensor as float32 (FP8 by DeepSeek's rule, MXFP4 by the GPT-OSS LUT)."""
    out = {}
    for name, t in ck.tensors.items():
        if name.endswith(("_scale_inv", "_scales")):
            continue
        if name.endswith("_blocks"):
            out[name] = mxfp4.decode(ck.get(name), ck.get(name.removesuffix("_blocks") + "_scales"))
        elif t.dtype == "F8_E4M3":
            out[name] = deepseek_dequant(ck.get(name), ck.get(name + "_scale_inv"))
        else:
            out[name] = ck.get(name).float()
    return out


@pytest.mark.parametrize("family", ["gpt-oss", "deepseek-v3"])
def test_same_seed_same_bytes(tmp_path: Path, synth_dir, family: str) -> None:
    a = synth_dir(family)
    b = tmp_path / "again"
    synthesize(family, b, seed=0)
    assert _digests(a) == _digests(b)
    ma, mb = (json.loads((d / "quantkit.json").read_text()) for d in (a, b))
    ma.pop("created"), mb.pop("created")
    assert ma == mb
    assert ma["options"] == {"family": family, "preset": "tiny", "layers": 2, "seed": 0, "layout": "root", "scale_fmt": "float"}


def test_same_bytes_whatever_the_thread_count(tmp_path: Path, synth_dir) -> None:
    code = "import sys, torch; torch.set_num_threads(1); from quantkit.synth import synthesize; synthesize('gpt-oss', sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "one")], check=True)
    assert _digests(tmp_path / "one") == _digests(synth_dir("gpt-oss"))


def test_other_seed_other_weights_same_tokenizer(tmp_path: Path, synth_dir) -> None:
    a, b = synth_dir("qwen3"), tmp_path / "seed1"
    synthesize("qwen3", b, seed=1)
    da, db = _digests(a), _digests(b)
    assert da["model-00001-of-00001.safetensors"] != db["model-00001-of-00001.safetensors"]
    assert da["tokenizer.json"] == db["tokenizer.json"] and da["config.json"] == db["config.json"]


def test_tensors_do_not_depend_on_sharding(tmp_path: Path, synth_dir) -> None:
    small = tmp_path / "sharded"
    synthesize("deepseek-v3", small, max_shard_size="1MB")
    a, b = Checkpoint(synth_dir("deepseek-v3")), Checkpoint(small)
    assert len(b.files()) > 3 and a.names() == b.names()
    for n in a.names():
        assert torch.equal(a.get(n).view(torch.uint8), b.get(n).view(torch.uint8)), n


def test_original_layout_holds_the_root_model(synth_dir) -> None:
    r, o = Checkpoint(synth_dir("gpt-oss")), Checkpoint(synth_dir("gpt-oss", layout="original"))
    same = {"embedding.weight": "model.embed_tokens.weight", "unembedding.weight": "lm_head.weight",
            "block.1.mlp.mlp1_weight.blocks": "model.layers.1.mlp.experts.gate_up_proj_blocks",
            "block.1.mlp.mlp2_weight.scales": "model.layers.1.mlp.experts.down_proj_scales",
            "block.0.mlp.gate.bias": "model.layers.0.mlp.router.bias", "block.0.attn.sinks": "model.layers.0.self_attn.sinks",
            "block.0.attn.norm.scale": "model.layers.0.input_layernorm.weight"}
    for on, rn in same.items():
        assert torch.equal(o.get(on), r.get(rn)), on
    p = "model.layers.0.self_attn."
    for kind in ("weight", "bias"):
        qkv = torch.cat([r.get(f"{p}{x}_proj.{kind}") for x in "qkv"])
        assert torch.equal(o.get(f"block.0.attn.qkv.{kind}"), qkv), kind


@pytest.mark.parametrize("family", FAMILIES)
def test_no_tensor_is_zero_or_constant(synth_dir, family: str) -> None:
    for name, w in _dequantized(Checkpoint(synth_dir(family))).items():
        assert torch.isfinite(w).all(), name
        assert w.std() > 0 and w.abs().max() > 0, f"{name} is constant"
        if w.numel() >= 4096:
            assert (w == 0).float().mean() < 0.3, f"{name}: too many zeros"


@pytest.mark.parametrize("family", FAMILIES)
def test_channels_differ_and_outliers_exist(synth_dir, family: str) -> None:
    ck = Checkpoint(synth_dir(family))
    name = {"gpt-oss": "model.layers.0.self_attn.q_proj.weight", "deepseek-v3": "model.layers.0.mlp.gate_proj.weight",
            "qwen3": "model.layers.1.mlp.up_proj.weight", "qwen3-moe": "model.layers.1.mlp.experts.3.down_proj.weight"}[family]
    w = _dequantized(ck)[name]
    rms_rows, rms_cols = w.pow(2).mean(1).sqrt(), w.pow(2).mean(0).sqrt()
    assert rms_rows.max() / rms_rows.min() > 3, "per-output-channel spread"
    assert rms_cols.max() / rms_cols.min() > 3, "per-input-channel (block) spread"
    # robust local sigma (medians ignore the outliers); a Gaussian never reaches 6 sigma in 32k draws
    a = w.abs()
    sigma = a.median(1).values[:, None] * a.median(0).values[None, :] / a.median() / 0.6745
    assert (a > 6 * sigma).sum() >= 2, "a few outliers"


def test_fp8_scales_spread(synth_dir) -> None:
    ck = Checkpoint(synth_dir("deepseek-v3"))
    s = ck.get("model.layers.0.mlp.down_proj.weight_scale_inv")  # [2, 4] tiles
    assert s.numel() >= 8 and s.max() / s.min() > 1.5


def test_mxfp4_scales_spread(synth_dir) -> None:
    ck = Checkpoint(synth_dir("gpt-oss"))
    s = ck.get("model.layers.0.mlp.experts.gate_up_proj_scales")
    assert len(torch.unique(s)) >= 4
    per_expert = s.float().mean(dim=(1, 2))
    assert len(torch.unique(per_expert)) == s.shape[0]


@pytest.mark.parametrize("scale_fmt", ["float", "ue8m0"])
def test_ragged_fp8_follows_deepseek_tile_rule(synth_dir, scale_fmt: str) -> None:
    """Partial edge tiles: each (possibly partial) tile's scale comes from its own elements only."""
    ck = Checkpoint(synth_dir("deepseek-v3", "tiny-ragged", scale_fmt=scale_fmt))
    assert ck.info("model.layers.0.self_attn.kv_a_proj_with_mqa.weight").shape == (192, 320)
    assert ck.info("model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv").shape == (2, 3)
    assert (ck.config["quantization_config"].get("scale_fmt") == "ue8m0") == (scale_fmt == "ue8m0")
    partial = 0
    for name in [n for n in ck.names() if n.endswith(".weight_scale_inv")]:
        q, s = ck.get(name.removesuffix("_scale_inv")), ck.get(name)
        m, n = q.shape
        assert s.dtype == torch.float32 and s.shape == ((m + 127) // 128, (n + 127) // 128), name
        partial += bool(m % 128 or n % 128)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                amax = q[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].float().abs().max().item()
                if scale_fmt == "float":
                    assert amax == E4M3_MAX, (name, i, j, amax)
                else:  # s = 2**ceil(log2(amax / 448)): the largest element lands in (224, 448], rounded: [224, 448]
                    assert E4M3_MAX / 2 <= amax <= E4M3_MAX, (name, i, j, amax)
                    assert torch.frexp(s[i, j])[0].item() == 0.5, "power of two"
    assert partial >= 10


def test_fp8_is_the_quantization_of_the_generated_weight(synth_dir) -> None:
    ck = Checkpoint(synth_dir("deepseek-v3", "tiny-ragged"))
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    w = weights.linear_full(0, name, 192, 320, 320**-0.5)
    s = ck.get(name + "_scale_inv")
    deq = deepseek_dequant(ck.get(name), s)
    tile = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:192, :320] * E4M3_MAX
    assert ((deq - w).abs() / tile).max() <= 2**-4, "E4M3 keeps 3 mantissa bits: error <= 1/16 of the tile amax"
