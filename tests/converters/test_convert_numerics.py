"""Numerics of the conversion paths, judged by references no converter code computes: transformers'
MXFP4 dequantizer, DeepSeek's published block dequant rule, and the formats/ quantizers applied to
whole tensors (the converter works in chunks)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from quantkit.converters.targets import round_bf16
from quantkit.formats import fp8_block, mxfp4, mxfp8
from quantkit.formats.rounding import Rounding

from .support import run, tensors


def deepseek_dequant(q: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    """DeepSeek-V3 inference/kernel.py weight_dequant, written as its loop over tiles (partial edges cut)."""
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = (slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block))
            out[tile] = q[tile].to(torch.float32) * s[i, j].to(torch.float32)
    return out


def test_gpt_oss_bf16_equals_transformers_mxfp4_dequantization(synth, tmp_path) -> None:
    src = synth("gpt-oss", "tiny-ragged")
    run(src, tmp_path / "o", to="bf16")
    s, o = tensors(src), tensors(tmp_path / "o")
    for i in range(2):
        for n in ("gate_up_proj", "down_proj"):
            p = f"model.layers.{i}.mlp.experts.{n}"
            ref = convert_moe_packed_tensors(s[p + "_blocks"], s[p + "_scales"], dtype=torch.bfloat16)
            assert o[p].dtype == torch.bfloat16
            assert torch.equal(o[p].view(torch.int16), ref.view(torch.int16)), p
    for name, t in s.items():
        if not name.endswith(("_blocks", "_scales")):
            assert torch.equal(o[name].view(torch.uint8), t.view(torch.uint8)), name


def test_mxfp4_to_mxfp8_is_exact(synth, tmp_path) -> None:
    src = synth("gpt-oss", "tiny-ragged")
    rep = run(src, tmp_path / "o", to="mxfp8", rounding="stochastic", seed=3)
    s, o = tensors(src), tensors(tmp_path / "o")
    p = "model.layers.1.mlp.experts.down_proj"
    assert torch.equal(mxfp8.dequantize(o[p], o[p + "_scale"]), mxfp4.decode(s[p + "_blocks"], s[p + "_scales"]))
    assert torch.equal(o[p + "_scale"], s[p + "_scales"])  # the E8M0 scales are kept byte for byte
    assert rep["paths"]["mxfp4->mxfp8"] == {"tensors": 4, "bytes": rep["paths"]["mxfp4->mxfp8"]["bytes"],
                                            "exact_path": True, "max_rel_err": 0.0, "min_exact_share": 1.0}


def test_ue8m0_fp8_block_to_mxfp8_is_exact_and_float_scales_requantize(synth, tmp_path) -> None:
    ue = synth("deepseek-v3", scale_fmt="ue8m0")
    run(ue, tmp_path / "u", to="mxfp8")
    s, o = tensors(ue), tensors(tmp_path / "u")
    p = "model.layers.1.self_attn.kv_b_proj.weight"
    assert torch.equal(mxfp8.dequantize(o[p], o[p + "_scale"]), deepseek_dequant(s[p], s[p + "_scale_inv"]))
    assert torch.equal(o[p].view(torch.uint8), s[p].view(torch.uint8))  # same E4M3 bytes
    m = json.loads((tmp_path / "u" / "quantkit.json").read_text())["tensors"]
    assert m[p]["path"] == "fp8-block(ue8m0)->mxfp8" and m[p]["exact_path"]
    run(synth("deepseek-v3"), tmp_path / "f", to="mxfp8")
    m = json.loads((tmp_path / "f" / "quantkit.json").read_text())["tensors"]
    assert m[p]["path"] == "requantize" and not m[p]["exact_path"] and m[p]["rel_err"] > 0


def test_same_format_is_copied(synth, tmp_path) -> None:
    src = synth("deepseek-v3", "tiny-ragged")
    run(src, tmp_path / "o", to="fp8-block", rounding="stochastic")
    s, o = tensors(src), tensors(tmp_path / "o")
    assert s.keys() == o.keys()
    for name in s:
        assert torch.equal(o[name].view(torch.uint8), s[name].view(torch.uint8)), name
    ue = synth("deepseek-v3", scale_fmt="ue8m0")  # a V3.1-style source keeps its ue8m0 scales by default
    run(ue, tmp_path / "u", to="fp8-block")
    assert json.loads((tmp_path / "u" / "config.json").read_text())["quantization_config"]["scale_fmt"] == "ue8m0"
    assert tensors(tmp_path / "u").keys() == tensors(ue).keys()


def test_float_scales_to_ue8m0_requantize_with_power_of_two_scales(synth, tmp_path) -> None:
    run(synth("deepseek-v3"), tmp_path / "o", to="fp8-block", scale_fmt="ue8m0")
    o = tensors(tmp_path / "o")
    s = o["model.layers.0.self_attn.o_proj.weight_scale_inv"]
    assert fp8_block.is_pow2_scale(s)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_quantize_equals_whole_tensor_reference_whatever_the_chunks(synth, tmp_path, rounding) -> None:
    src = synth("qwen3", "tiny-ragged")
    w = tensors(src)["model.layers.1.mlp.down_proj.weight"]  # [320, 448]: partial tiles both ways
    name = "model.layers.1.mlp.down_proj.weight"
    r = Rounding(rounding, 11, name)  # type: ignore[arg-type]
    seed = 11 if rounding == "stochastic" else None
    for chunk in (128 * 64, 1 << 22):  # 128-row bands of a 448-wide weight vs one band
        run(src, tmp_path / f"b{chunk}", to="fp8-block", rounding=rounding, seed=seed, chunk_elements=chunk)
        run(src, tmp_path / f"m{chunk}", to="mxfp8", rounding=rounding, seed=seed, chunk_elements=chunk, scale_rule="floor")
        q, s = fp8_block.quantize_weight(w, rounding=r)
        o = tensors(tmp_path / f"b{chunk}")
        assert torch.equal(o[name].view(torch.uint8), q.view(torch.uint8)) and torch.equal(o[name + "_scale_inv"], s)
        q, s = mxfp8.quantize(w, rule="floor", rounding=r)
        o = tensors(tmp_path / f"m{chunk}")
        assert torch.equal(o[name].view(torch.uint8), q.view(torch.uint8)) and torch.equal(o[name + "_scale"], s)


def test_fp8_dequantize_to_bf16_follows_deepseeks_rule(synth, tmp_path) -> None:
    src = synth("deepseek-v3", "tiny-ragged")
    run(src, tmp_path / "o", to="bf16")
    s, o = tensors(src), tensors(tmp_path / "o")
    p = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"  # partial row and column tiles
    ref = deepseek_dequant(s[p], s[p + "_scale_inv"]).to(torch.bfloat16)
    assert torch.equal(o[p].view(torch.int16), ref.view(torch.int16))
    assert o["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32


def test_fidelity_record_matches_an_independent_computation(synth, tmp_path) -> None:
    src = synth("gpt-oss", "tiny-ragged")
    run(src, tmp_path / "o", to="fp8-block")
    s, o = tensors(src), tensors(tmp_path / "o")
    p = "model.layers.0.mlp.experts.gate_up_proj"
    ref = mxfp4.decode(s[p + "_blocks"], s[p + "_scales"]).double()
    got = fp8_block.dequantize_weight(o[p], o[p + "_scale_inv"]).double()
    rec = json.loads((tmp_path / "o" / "quantkit.json").read_text())["tensors"][p]
    assert rec["path"] == "requantize" and rec["exact_path"] is False
    assert rec["rel_err"] == pytest.approx(float((got - ref).norm() / ref.norm()), rel=1e-5)
    assert rec["max_abs_err"] == pytest.approx(float((got - ref).abs().max()), rel=1e-5)
    assert rec["exact_share"] == pytest.approx(float((got == ref).double().mean()), rel=1e-5)
    assert rec["numel"] == ref.numel()


def test_stochastic_bf16_rounding_picks_a_neighbour_and_keeps_exact_values(gen) -> None:
    x = torch.randn(4096, generator=gen) * 3
    r = Rounding("stochastic", 5, "t")
    y = round_bf16(x, r).float()
    lo = x.to(torch.bfloat16).float()
    down = torch.where(lo > x, torch.nextafter(lo.bfloat16(), torch.tensor(-math.inf, dtype=torch.bfloat16)).float(), lo)
    up = torch.where(lo < x, torch.nextafter(lo.bfloat16(), torch.tensor(math.inf, dtype=torch.bfloat16)).float(), lo)
    assert bool(((y == down) | (y == up)).all())
    exact = x.to(torch.bfloat16).float()
    assert torch.equal(round_bf16(exact, r).float(), exact)
    # unbiased: the mean error over many roundings of one value is far below one ulp
    v = torch.full((20000,), 1.0 + 2**-9)  # 1/4 of the way from 1 to the next bf16 (1 + 2**-7)
    mean = round_bf16(v, r).float().mean().item()
    assert abs(mean - (1.0 + 2**-9)) < 2**-7 * 0.02
