"""One registration per extension: a numeric format defined in one file (tests/fake_format.py) and a model family
declared in one file (tests/fake_family.py) are picked up wherever quantkit names formats and families, with no
other file edited: convert's --to choices, the engine's quantized linear and fused MoE, the converter; synth,
inspect, convert, shard and the engine for the family."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from click.testing import CliRunner

from quantkit import families, formats
from quantkit.checkpoint import Checkpoint
from quantkit.cli import main
from quantkit.kernels import dispatch

HERE = Path(__file__).parent


def _load(name: str) -> ModuleType:
    """Import tests/<name>.py as a module of its own (defining it registers what it defines)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake_format() -> Iterator[ModuleType]:
    ops = set(dispatch.REGISTRY.ops)
    assert "fp8-g64" not in formats.FORMATS
    yield _load("fake_format")
    formats.FORMATS.pop("fp8-g64")  # leave the registries as the other tests expect them
    for op in set(dispatch.REGISTRY.ops) - ops:
        del dispatch.REGISTRY.ops[op]
    sys.modules.pop("fake_format")


@pytest.fixture
def fake_family() -> Iterator[ModuleType]:
    assert "toy-lm" not in families.FAMILIES
    yield _load("fake_family")
    families.FAMILIES.pop("toy-lm")
    sys.modules.pop("fake_family")


def cli(*args: str) -> str:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_a_format_is_one_file(fake_format) -> None:
    fmt = formats.get("fp8-g64")
    assert isinstance(fmt, fake_format.Fp8G64)
    assert formats.convert_targets() == ["fp8-block", "mxfp8", "mxfp4", "fp8-g64", "bf16"]
    assert "fp8-g64" in formats.act_formats()
    assert "--to [fp8-block|mxfp8|mxfp4|fp8-g64|bf16]" in cli("convert", "--help")


def test_the_engine_runs_a_linear_of_the_format(fake_format, gen) -> None:
    from quantkit.engine.qlinear import ActQuant, Linear, Quantized, RowGroup, linear

    x, w = torch.randn(3, 256, generator=gen), torch.randn(96, 256, generator=gen) / 16
    q, s = fake_format.quantize(w)
    lin = Quantized("fp8-g64", q, s, act=ActQuant("fp8-g64"))
    want = fake_format.dequantize(*fake_format.quantize(x)) @ fake_format.dequantize(q, s).T  # the format's spec
    torch.testing.assert_close(linear(x, lin), want, rtol=1e-6, atol=1e-6)
    assert lin.ops.ran == {"act_quant_fp8_g64": "torch", "gemm_fp8_g64": "torch"}
    plain = Quantized("fp8-g64", q, s)  # activations unquantized: the weight dequantized, a float32 matmul
    torch.testing.assert_close(linear(x, plain), x @ fake_format.dequantize(q, s).T, rtol=1e-6, atol=1e-6)
    assert plain.ops.ran == {"fp8_g64_dequant": "torch"}
    parts = [Linear(Quantized("fp8-g64", *fake_format.quantize(t), act=ActQuant("fp8-g64"))) for t in (w[:32], w[32:])]
    group = RowGroup(parts)
    assert group.fused() is not None  # two projections of one input stack into one GEMM
    torch.testing.assert_close(torch.cat(group(x), -1), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="fp8-g64 weight .* needs F8_E4M3, K % 64 == 0"):
        Quantized("fp8-g64", q[:, :96], s)


def test_the_fused_moe_takes_experts_of_the_format(fake_format, gen) -> None:
    from quantkit.engine.layers.moe import Experts
    from quantkit.engine.qlinear import ActQuant, Quantized

    act = ActQuant("fp8-g64")

    def stacked(e: int, n: int, k: int) -> Quantized:
        return Quantized("fp8-g64", *fake_format.quantize(torch.randn(e, n, k, generator=gen) / k**0.5), act=act)

    experts = Experts(stacked(4, 128, 64), gate=stacked(4, 64, 128), up=stacked(4, 64, 128))
    assert experts.path == "fused_moe"
    x = torch.randn(5, 128, generator=gen)
    idx = torch.tensor([[0, 1], [1, 3], [2, 0], [3, 2], [0, 3]])
    w = torch.rand(5, 2, generator=gen)
    torch.testing.assert_close(experts(x, w, idx), experts.loop(x, w, idx), rtol=1e-5, atol=1e-5)
    assert experts.ops.ran["fused_moe"] == "torch"


def test_convert_writes_the_format(fake_format, tmp_path) -> None:
    cli("synth", "qwen3", str(tmp_path / "src"), "--preset", "tiny")
    rep = json.loads(cli("convert", str(tmp_path / "src"), str(tmp_path / "g64"), "--to", "fp8-g64", "--json", "-q"))
    assert rep["options"]["to"] == "fp8-g64"
    cfg = json.loads((tmp_path / "g64/config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "fp8-g64"
    src, out = Checkpoint(tmp_path / "src"), Checkpoint(tmp_path / "g64")
    name = "model.layers.1.mlp.down_proj.weight"
    q, s = fake_format.quantize(src.get(name).float())  # the format's own reference, on the source weight
    assert out.get(name).dtype == torch.float8_e4m3fn and out.get(name + "_scale").shape == (256, 512 // 64)
    assert torch.equal(out.get(name).view(torch.uint8), q.view(torch.uint8)) and torch.equal(out.get(name + "_scale"), s)
    assert out.get("model.embed_tokens.weight").dtype == torch.bfloat16  # what the family keeps stays


def test_a_family_is_one_file(fake_family, tmp_path) -> None:
    from quantkit.engine import load, prefill_logits

    cli("synth", "toy-lm", str(tmp_path / "toy"), "--preset", "tiny", "--seed", "3")
    assert json.loads((tmp_path / "toy/config.json").read_text())["architectures"] == ["ToyLmForCausalLM"]
    rep = json.loads(cli("inspect", str(tmp_path / "toy"), "--json"))
    assert rep["family"] == "toy-lm" and not rep["problems"], rep["problems"]
    cli("convert", str(tmp_path / "toy"), str(tmp_path / "toy-fp8"), "--to", "fp8-block", "-q")
    cli("shard", str(tmp_path / "toy"), str(tmp_path / "toy-tp2"), "--ep", "2", "--tp", "2", "-q")
    splits = json.loads((tmp_path / "toy-tp2/rank-00001-of-00002/config.json").read_text())["quantkit_shard"]["splits"]
    p = "model.layers.0."
    assert splits[p + "self_attn.q_proj.weight"]["dim"] == 0 and splits[p + "mlp.down_proj.weight"]["dim"] == 1  # its rules
    assert p + "self_attn.q_norm.weight" not in splits  # replicated
    cli("synth", "qwen3", str(tmp_path / "qwen3"), "--preset", "tiny", "--seed", "3")  # the same weights as Qwen3
    seqs = [torch.tensor([1, 5, 9, 200, 31])]
    toy = prefill_logits(load(tmp_path / "toy", dtype=torch.float32), seqs)[0]
    assert torch.equal(toy, prefill_logits(load(tmp_path / "qwen3", dtype=torch.float32), seqs)[0])
    assert load(tmp_path / "toy-fp8", dtype=torch.float32).family == "toy-lm"
