"""``--to mxfp4``: GPT-OSS back in the layout it ships in (transformers' MXFP4 dequantizer is the judge of
that layout), other families in compressed-tensors' MXFP4 (its own dequantizer is the judge), and the
engine serving both."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.checkpoint import CheckpointError
from quantkit.converters import OptionError
from quantkit.engine.loader import load
from quantkit.engine.run import prefill_logits
from quantkit.formats import mxfp4

from . import ct
from .support import header, run, tensors, write_qwen3

EXPERTS = [f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")]
TOKENS = [1, 5, 9, 200, 17, 3, 1000, 42, 7, 11]


def test_gpt_oss_bf16_back_to_mxfp4_returns_the_shipped_layout(synth, tmp_path) -> None:
    src = synth("gpt-oss")
    run(src, tmp_path / "bf16", to="bf16")
    rep = run(tmp_path / "bf16", tmp_path / "o", to="mxfp4")
    assert header(tmp_path / "o") == header(src)  # every name, dtype and shape as upstream
    cfg, src_cfg = (json.loads((p / "config.json").read_text()) for p in (tmp_path / "o", src))
    assert cfg["quantization_config"] == src_cfg["quantization_config"]
    s, o = tensors(src), tensors(tmp_path / "o")
    for name in s:
        if not name.endswith(("_blocks", "_scales")):
            assert torch.equal(o[name], s[name]), name  # attention, routers, norms, biases: BF16 as shipped
    for p in EXPERTS:
        assert rep["tensors"][p]["path"] == "quantize" and rep["tensors"][p]["exact_share"] == 1.0
        assert torch.equal(mxfp4.decode(o[p + "_blocks"], o[p + "_scales"]), mxfp4.decode(s[p + "_blocks"], s[p + "_scales"]))
        # rceil gives each block the scale that puts its largest value in (3, 6]: the source's, byte for byte,
        # unless its largest value is 3 x scale or less, where half that scale holds the same values
        top = (mxfp4.unpack(s[p + "_blocks"]) & 7).amax(-1)  # largest magnitude code per block (6: value 4, 7: value 6)
        canonical = top >= 6
        assert canonical.float().mean() > 0.5
        assert torch.equal(o[p + "_blocks"][canonical], s[p + "_blocks"][canonical])
        assert torch.equal(o[p + "_scales"][canonical], s[p + "_scales"][canonical])
        assert torch.equal(o[p + "_scales"][~canonical].int(), s[p + "_scales"][~canonical].int() - 1)


def test_gpt_oss_mxfp4_source_is_copied(synth, tmp_path) -> None:
    rep = run(synth("gpt-oss"), tmp_path / "o", to="mxfp4", rounding="stochastic", seed=3)
    assert rep["paths"]["copy-mxfp4"] == {**rep["paths"]["copy-mxfp4"], "tensors": 4, "exact_path": True}
    assert rep.get("note") == "exact paths (copy-mxfp4) round nothing: --rounding does not apply to them"
    s, o = tensors(synth("gpt-oss")), tensors(tmp_path / "o")
    assert set(s) == set(o) and all(torch.equal(o[n], s[n]) for n in s)


def test_transformers_reads_our_mxfp4_as_the_engine_does(synth, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, Mxfp4Config

    run(synth("gpt-oss"), tmp_path / "bf16", to="bf16")
    rep = run(tmp_path / "bf16", tmp_path / "o", to="mxfp4", rounding="stochastic", seed=5)
    assert "note" not in rep  # its only exact path is plain copies (norms, router, embeddings), which never round
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "o", dtype=torch.bfloat16, quantization_config=Mxfp4Config(dequantize=True))
    ours = load(tmp_path / "o", act_quant=False)
    for i in range(2):
        t, e = theirs.model.layers[i].mlp.experts, ours.layers[i].mlp.experts
        for name, w in (("gate_up_proj", e.gate_up), ("down_proj", e.down)):
            mine = torch.stack([w.dequant(x) for x in range(w.num_experts)])  # [E, out, in] float32
            assert torch.equal(getattr(t, name).transpose(1, 2), mine.bfloat16()), f"layer {i} {name}"  # theirs [E, in, out]


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe", "deepseek-v3"])
def test_other_families_write_compressed_tensors_mxfp4(synth, tmp_path, family) -> None:
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationConfig

    run(synth(family), tmp_path / "o", to="mxfp4")
    q = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert q["format"] == "mxfp4-pack-quantized" and q["config_groups"]["group_0"]["input_activations"] is None
    QuantizationConfig.model_validate(q)  # the library accepts our config
    h, (_, (n, k)) = header(tmp_path / "o"), header(synth(family))["model.layers.1.self_attn.o_proj.weight"]
    assert h["model.layers.1.self_attn.o_proj.weight_packed"] == ("U8", [n, k // 2])
    assert h["model.layers.1.self_attn.o_proj.weight_scale"] == ("U8", [n, k // 32])
    rep = run(tmp_path / "o", tmp_path / "bf16", to="bf16")
    assert rep["paths"]["mxfp4->bf16"]["exact_path"] is True
    judge = ct.dequantize(tmp_path / "o")  # compressed-tensors' reading of our bytes
    ours = tensors(tmp_path / "bf16")
    assert set(judge) == set(ours) and all(torch.equal(ours[n], judge[n]) for n in judge)
    # the engine serves it (weights dequantized per layer, activations in BF16) as it serves those values in BF16
    a = prefill_logits(load(tmp_path / "o"), [TOKENS])[0]
    b = prefill_logits(load(tmp_path / "bf16"), [TOKENS])[0]
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_stochastic_mxfp4_conversion_is_reproducible(synth, tmp_path) -> None:
    src = synth("qwen3")
    run(src, tmp_path / "a", to="mxfp4", rounding="stochastic", seed=7)
    run(src, tmp_path / "b", to="mxfp4", rounding="stochastic", seed=7, chunk_elements=4096)  # other chunks, same bytes
    run(src, tmp_path / "c", to="mxfp4", rounding="stochastic", seed=8)
    a, b, c = (tensors(tmp_path / x) for x in "abc")
    name = "model.layers.0.mlp.down_proj.weight_packed"
    assert all(torch.equal(a[n], b[n]) for n in a) and not torch.equal(a[name], c[name])


def test_mxfp4_errors(synth, tmp_path) -> None:
    with pytest.raises(OptionError, match="--scale-fmt applies to --to fp8-block only"):
        run(synth("qwen3"), tmp_path / "o", to="mxfp4", scale_fmt="ue8m0")
    with pytest.raises(OptionError, match="matches no weight that --to would quantize"):  # GPT-OSS attention stays BF16
        run(synth("gpt-oss"), tmp_path / "o", to="mxfp4", ignore=("*.self_attn.q_proj",))
    write_qwen3(tmp_path / "k200", hidden=128, inter=200, layers=1, vocab=64)  # down_proj K = 200
    with pytest.raises(CheckpointError, match="down_proj.weight: K=200 is not a multiple of 32; MXFP4 has no layout"):
        run(tmp_path / "k200", tmp_path / "o", to="mxfp4")
    assert not (tmp_path / "o").exists()
