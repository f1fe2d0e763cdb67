"""``eval accuracy`` on the tiny synthetic checkpoint of every family: synth -> convert to fp8-block,
mxfp8-nearest, mxfp8-stochastic -> compare with transformers (float32) on the source.

Also checks, per family, that the engine on the source with unquantized activations reproduces
transformers (so the two agree on layer indexing), and that a lossless conversion measures as
lossless (DeepSeek float-scale FP8 -> fp8-block copies the blocks)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main

FAST = ["--tokens", "256", "--ctx", "64", "--no-progress", "--json"]
TARGETS = {"fp8-block": ["--to", "fp8-block"], "mxfp8-nearest": ["--to", "mxfp8"],
           "mxfp8-stochastic": ["--to", "mxfp8", "--rounding", "stochastic", "--seed", "7"]}


def cli(*args: str) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


def build(family: str, root: Path) -> dict[str, Path]:
    paths = {"source": root / family}
    cli("synth", family, str(paths["source"]), "--preset", "tiny")
    for name, opts in TARGETS.items():
        paths[name] = root / name
        cli("convert", str(paths["source"]), str(paths[name]), *opts)
    return paths


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe", "gpt-oss", "deepseek-v3"])
def test_family(family, tmp_path):
    p = build(family, tmp_path)
    n_layers = json.loads((p["source"] / "config.json").read_text())["num_hidden_layers"]

    # the engine on the source, activations unquantized, is transformers' float32 model
    same = json.loads(cli("eval", "accuracy", str(p["source"]), "--reference", str(p["source"]), "--no-act-quant", *FAST))
    s = same["candidates"][0]
    assert s["kld_max"] < 1e-8 and s["top1_pct"] == 100.0, s
    assert len(s["hidden_rel_err"]) == n_layers + 1 and max(s["hidden_rel_err"]) < 1e-5, s["hidden_rel_err"]

    rep = json.loads(cli("eval", "accuracy", *(str(p[t]) for t in TARGETS), "--reference", str(p["source"]), *FAST))
    assert [c["name"] for c in rep["candidates"]] == list(TARGETS)
    assert rep["n_scored"] == 4 * 31
    for c in rep["candidates"]:
        assert c["kld_mean"] > 0 and all(math.isfinite(c[k]) for k in ("kld_mean", "kld_err", "ppl_ratio", "rms_dp_pct"))
        assert c["kld_median"] <= c["kld_p95"] <= c["kld_p99"] <= c["kld_p999"] <= c["kld_max"]
        assert 0 <= c["top1_pct"] <= 100 and c["max_abs_dlogit"] > 0
        errs = c["hidden_rel_err"]
        assert errs[0] == 0.0 and all(e > 0 for e in errs[1:])  # embeddings stay in source precision


def test_lossless_conversion_measures_lossless(tmp_path):
    """DeepSeek float-scale FP8 -> fp8-block keeps every block: with the source's own numerics
    (activations unquantized on both sides) nothing may differ."""
    src, dst = tmp_path / "ds", tmp_path / "ds-fp8"
    cli("synth", "deepseek-v3", str(src), "--preset", "tiny")
    cli("convert", str(src), str(dst), "--to", "fp8-block")
    c = json.loads(cli("eval", "accuracy", str(dst), "--reference", str(src), "--no-act-quant", *FAST))["candidates"][0]
    assert c["kld_max"] < 1e-8 and c["top1_pct"] == 100.0 and max(c["hidden_rel_err"]) < 1e-5
