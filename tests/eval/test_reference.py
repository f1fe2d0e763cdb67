"""The other references: ``--impl engine`` (the engine on the source) and ``--impl gpt-oss``
(openai/gpt-oss's torch reference on the ``original/`` layout, when that package is installed)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from click.testing import CliRunner

from quantkit.cli import main

FAST = ["--tokens", "256", "--ctx", "64", "--no-progress", "--json"]


def cli(*args: str, code: int = 0):
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == code, res.output
    return res


@pytest.fixture(scope="module")
def gpt_oss_original(tmp_path_factory):
    d = tmp_path_factory.mktemp("goss")
    src, bf16 = d / "orig", d / "bf16"
    cli("synth", "gpt-oss", str(src), "--preset", "tiny", "--layout", "original")
    cli("convert", str(src), str(bf16), "--to", "bf16")  # root layout, MXFP4 experts decoded exactly
    yield src, bf16
    shutil.rmtree(d, ignore_errors=True)


def test_impl_engine_reference(tmp_path):
    src = tmp_path / "q"
    cli("synth", "qwen3", str(src), "--preset", "tiny")
    rep = json.loads(cli("eval", "accuracy", str(src), "--reference", str(src), "--impl", "engine", "--no-act-quant", *FAST).stdout)
    c = rep["candidates"][0]
    assert "engine" in rep["reference_runner"] and "unquantized activations" in rep["reference_runner"]
    assert c["kld_max"] == 0.0 and c["max_abs_dlogit"] == 0.0 and c["top1_pct"] == 100.0  # the same computation
    assert c["hidden_rel_err"] == [0.0] * len(c["hidden_rel_err"])


def test_impl_gpt_oss_missing_package(gpt_oss_original, monkeypatch):
    src, bf16 = gpt_oss_original
    monkeypatch.setitem(sys.modules, "gpt_oss", None)
    res = cli("eval", "accuracy", str(bf16), "--reference", str(src), "--impl", "gpt-oss", *FAST, code=1)
    assert "needs the gpt-oss package" in res.output


def test_impl_gpt_oss_needs_original_layout(gpt_oss_original):
    pytest.importorskip("gpt_oss.torch.model")
    src, bf16 = gpt_oss_original
    res = cli("eval", "accuracy", str(bf16), "--reference", str(bf16), "--impl", "gpt-oss", *FAST, code=1)
    assert "original/" in res.output


def test_impl_gpt_oss_agrees_with_engine(gpt_oss_original):
    """The gpt-oss torch reference (float32) and the engine on the bf16 conversion compute the same
    model: the hooks on ``embedding`` / ``block[i]`` index the same points as the engine's list."""
    pytest.importorskip("gpt_oss.torch.model")
    src, bf16 = gpt_oss_original
    rep = json.loads(cli("eval", "accuracy", str(bf16), "--reference", str(src), "--impl", "gpt-oss", "--no-act-quant", *FAST).stdout)
    c = rep["candidates"][0]
    assert "gpt-oss torch reference" in rep["reference_runner"]
    assert c["kld_max"] < 1e-8 and c["top1_pct"] == 100.0
    assert len(c["hidden_rel_err"]) == 3 and max(c["hidden_rel_err"]) < 1e-5


def test_partial_tiles_need_the_engine_reference(tmp_path):
    """transformers' FP8 dequantizer rejects DeepSeek's partial 128-tiles (REFERENCE.md): a clear
    error naming --impl engine, which then measures the checkpoint against itself as lossless."""
    src = tmp_path / "ragged"
    cli("synth", "deepseek-v3", str(src), "--preset", "tiny-ragged")
    res = cli("eval", "accuracy", str(src), "--reference", str(src), *FAST, code=1)
    assert "transformers cannot load this checkpoint" in res.output and "--impl engine" in res.output
    c = json.loads(cli("eval", "accuracy", str(src), "--reference", str(src), "--impl", "engine", "--no-act-quant", *FAST).stdout)["candidates"][0]
    assert c["kld_max"] == 0.0 and c["top1_pct"] == 100.0
