"""compressed-tensors checkpoints as convert sources.  The sources are made by the compressed-tensors
library (tests/converters/ct.py) and the library's own dequantizer is the judge of what their bytes
mean; quantkit's ``--to mxfp8`` output, read back, is judged the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from quantkit.checkpoint import CheckpointError
from quantkit.formats import fp8_block

from . import ct
from .support import edit_config, run, tensors

pytest.importorskip("compressed_tensors")

# preset -> (path of a quantized projection to bf16, whether that path is exact)
BF16_PATHS = {"FP8_BLOCK": ("dequantize", False), "FP8": ("dequantize", False), "FP8_DYNAMIC": ("dequantize", False),
              "MXFP8": ("mxfp8->bf16", True), "MXFP4": ("mxfp4->bf16", True)}


@pytest.fixture(scope="module")
def ct_source(synth, tmp_path_factory):
    """``ct_source(preset, family="qwen3", **make_kw)`` -> a compressed-tensors checkpoint, made once."""
    made: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("ct")

    def get(preset: str, family: str = "qwen3", **kw) -> Path:
        key = (preset, family, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = ct.make(synth(family), root / f"{family}-{preset}-{len(made)}", preset, **kw)
        return made[key]

    return get


def assert_equal_tensors(ours: dict[str, torch.Tensor], judge: dict[str, torch.Tensor]) -> None:
    assert set(ours) == set(judge), set(ours) ^ set(judge)
    for name, t in judge.items():
        assert ours[name].dtype == t.dtype and torch.equal(ours[name], t), name


@pytest.mark.parametrize("preset, dtype", [("FP8_BLOCK", torch.bfloat16), ("FP8_BLOCK", torch.float32), ("FP8", torch.bfloat16),
                                           ("FP8_DYNAMIC", torch.float32), ("MXFP8", torch.bfloat16), ("MXFP4", torch.bfloat16)])
def test_bf16_is_what_compressed_tensors_dequantizes(ct_source, tmp_path, preset, dtype) -> None:
    src = ct_source(preset, dtype=dtype, static_input=preset == "FP8")
    rep = run(src, tmp_path / "o", to="bf16")
    judge = ct.dequantize(src)
    judge = {k: v for k, v in judge.items() if not k.endswith(".input_scale")}  # a static activation scale: dropped
    assert_equal_tensors(tensors(tmp_path / "o"), judge)
    path, exact = BF16_PATHS[preset]
    assert rep["paths"][path]["tensors"] == 14 and rep["paths"][path]["exact_path"] is exact  # 2 layers x 7 projections
    assert "quantization_config" not in json.loads((tmp_path / "o" / "config.json").read_text())


@pytest.mark.parametrize("preset", ["MXFP8", "FP8_BLOCK"])
def test_moe_experts_and_ignored_routers(ct_source, tmp_path, preset) -> None:
    src = ct_source(preset, family="qwen3-moe")
    run(src, tmp_path / "bf16", to="bf16")
    assert_equal_tensors(tensors(tmp_path / "bf16"), ct.dequantize(src))
    rep = run(src, tmp_path / "fp8", to="fp8-block")
    s, o = tensors(src), tensors(tmp_path / "fp8")
    name = "model.layers.1.mlp.experts.5.down_proj.weight"
    assert o["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16  # the ignored router stays unquantized
    if preset == "FP8_BLOCK":  # same format: the bytes move, BF16 block scales widen exactly to F32
        assert rep["paths"]["copy-fp8-block"]["exact_path"] is True
        assert torch.equal(o[name].view(torch.uint8), s[name].view(torch.uint8))
        assert torch.equal(o[name + "_scale_inv"], s[name + "_scale"].float())


def test_ignore_list_decides_what_is_read_as_quantized(ct_source, tmp_path) -> None:
    src = shutil.copytree(ct_source("FP8_DYNAMIC", ignore=(*ct.DEFAULT_IGNORE, r"re:.*self_attn\..*")), tmp_path / "src")
    run(src, tmp_path / "o", to="bf16")
    s, o = tensors(src), tensors(tmp_path / "o")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert s[name].dtype == torch.bfloat16 and torch.equal(o[name], s[name])  # ignored: copied as stored
    # the same tensors with lm_head no longer ignored: the config says it is FP8, the file does not
    edit_config(src, lambda c: c["quantization_config"].update(ignore=[r"re:.*self_attn\..*"]))
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' \(fp8-channel weight \(quantization_config compressed-tensors\)\) is BF16"):
        run(src, tmp_path / "bad", to="bf16")
    assert not (tmp_path / "bad").exists()


def test_static_activation_scales_are_dropped(ct_source, tmp_path) -> None:
    src = ct_source("FP8", static_input=True)
    assert any(n.endswith(".input_scale") for n in tensors(src))
    run(src, tmp_path / "o", to="mxfp8")
    assert not any(n.endswith("input_scale") for n in tensors(tmp_path / "o"))


def test_mxfp4_source_to_mxfp8_is_exact(ct_source, tmp_path) -> None:
    src = ct_source("MXFP4")
    rep = run(src, tmp_path / "o", to="mxfp8")
    assert rep["paths"]["mxfp4->mxfp8"]["exact_path"] is True and rep["paths"]["mxfp4->mxfp8"]["tensors"] == 14
    judge, o = ct.dequantize(src), tensors(tmp_path / "o")
    name = "model.layers.1.mlp.up_proj.weight"
    deq = o[name].float().unflatten(-1, (-1, 32)) * torch.exp2(o[name + "_scale"].float() - 127).unsqueeze(-1)
    assert torch.equal(deq.flatten(-2).bfloat16(), judge[name])


def test_quantkit_mxfp8_reads_back_as_compressed_tensors_reads_it(synth, tmp_path) -> None:
    run(synth("qwen3"), tmp_path / "mx8", to="mxfp8")
    rep = run(tmp_path / "mx8", tmp_path / "bf16", to="bf16")
    assert rep["paths"]["mxfp8->bf16"]["exact_path"] is True
    assert_equal_tensors(tensors(tmp_path / "bf16"), ct.dequantize(tmp_path / "mx8"))


def test_gpt_oss_mxfp8_round_trip(synth, tmp_path) -> None:
    src = synth("gpt-oss")
    run(src, tmp_path / "mx8", to="mxfp8")
    run(tmp_path / "mx8", tmp_path / "back", to="bf16")
    run(src, tmp_path / "direct", to="bf16")  # equal to transformers' MXFP4 dequantization (test_convert_interop)
    back, direct = tensors(tmp_path / "back"), tensors(tmp_path / "direct")
    experts = [n for n in direct if ".mlp.experts." in n and not n.endswith("_bias")]
    assert len(experts) == 4 and all(torch.equal(back[n], direct[n]) for n in experts)
    rep = run(tmp_path / "mx8", tmp_path / "fp8", to="fp8-block")
    mx, o = tensors(tmp_path / "mx8"), tensors(tmp_path / "fp8")
    for name, rec in rep["tensors"].items():
        if not rec["path"].startswith("mxfp8->fp8-block"):
            continue
        # the tiles reported exact are exactly those whose values survive (DeepSeek's dequantization rule)
        x = mx[name].float().unflatten(-1, (-1, 32)) * torch.exp2(mx[name + "_scale"].float() - 127).unsqueeze(-1)
        y = fp8_block.dequantize_weight(o[name], o[name + "_scale_inv"])
        same = fp8_block.tile_amax((y != x.flatten(-2)).float()) == 0
        assert rec["exact_tiles"] == f"{int(same.sum())}/{same.numel()}", name
        assert rec["exact_path"] is bool(same.all())


def test_deepseek_ue8m0_through_mxfp8_returns_its_bytes(synth, tmp_path) -> None:
    src = synth("deepseek-v3", scale_fmt="ue8m0")
    run(src, tmp_path / "mx8", to="mxfp8")
    rep = run(tmp_path / "mx8", tmp_path / "back", to="fp8-block", scale_fmt="ue8m0")
    assert set(rep["paths"]) == {"copy", "mxfp8->fp8-block"} and rep["paths"]["mxfp8->fp8-block"]["exact_path"] is True
    s, o = tensors(src), tensors(tmp_path / "back")
    assert set(s) == set(o)
    for name, t in s.items():
        assert o[name].dtype == t.dtype and torch.equal(o[name].view(torch.uint8), t.view(torch.uint8)), name


@pytest.mark.parametrize("edit, match", [
    (lambda q: q["config_groups"]["group_0"]["weights"].update(type="int"), r"config_groups.group_0.weights is int"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(group_size=16), r"group_size 16, .* is not supported"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block", block_structure=[1, 32]), r"block_structure \[1, 32\]"),
    (lambda q: q.update(quantization_status="frozen"), r"quantization_status 'frozen'"),
    (lambda q: q.update(transform_config={"config_groups": {"u": {}}}), r"transform_config is set"),
    (lambda q: q.update(kv_cache_scheme={"num_bits": 8}), r"kv_cache_scheme is set"),
])
def test_unsupported_compressed_tensors_configs_are_refused(ct_source, tmp_path, edit, match) -> None:
    src = shutil.copytree(ct_source("MXFP8"), tmp_path / "src")
    edit_config(src, lambda c: edit(c["quantization_config"]))
    with pytest.raises(CheckpointError, match=match):
        run(src, tmp_path / "o", to="bf16")
    assert not (tmp_path / "o").exists()
