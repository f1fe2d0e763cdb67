"""``quantkit eval expert-load``: routing counts per MoE layer, judged by transformers' router on the same
windows; refusals (an existing output, a model without experts) write nothing."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.eval.data import make_windows
from quantkit.eval.reference import TransformersRunner
from quantkit.synth import synthesize


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    return synthesize("qwen3-moe", tmp_path_factory.mktemp("load") / "qwen3-moe", preset="tiny")["path"]


def test_counts_equal_transformers_routing(qwen3_moe, tmp_path):
    out = tmp_path / "load.json"
    r = CliRunner().invoke(main, ["eval", "expert-load", qwen3_moe, "-o", str(out), "--tokens", "128", "--ctx", "64",
                                  "--dtype", "float32", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    got = {int(k): torch.tensor(v) for k, v in json.loads(out.read_text())["layers"].items()}
    ref = TransformersRunner(qwen3_moe)
    want = {i: torch.zeros(8, dtype=torch.int64) for i in range(len(ref.layers))}

    def counter(i: int):
        def hook(_mod, _inp, out) -> None:  # transformers' Qwen3MoeTopKRouter returns (logits, scores, expert ids)
            want[i].add_(torch.bincount(out[2].flatten(), minlength=8))
        return hook

    hooks = [layer.mlp.gate.register_forward_hook(counter(i)) for i, layer in enumerate(ref.layers)]
    for ids in make_windows(qwen3_moe, None, 128, 64, int(ref.model.config.vocab_size)).tokens:
        ref.forward(ids)
    for h in hooks:
        h.remove()
    assert set(got) == set(want)
    for i in want:  # float32 on both sides: a near-tie may route one slot differently, no more
        assert int(want[i].sum()) == 2 * 128 and int(got[i].sum()) == 2 * 128
        assert int((got[i] - want[i]).abs().sum()) <= 4, (i, got[i], want[i])


def test_refusals_write_nothing(qwen3_moe, tmp_path):
    out = tmp_path / "load.json"
    out.write_text("mine")
    r = CliRunner().invoke(main, ["eval", "expert-load", qwen3_moe, "-o", str(out)])
    assert r.exit_code == 1 and "exists: pass --force" in r.output and out.read_text() == "mine"
    dense = synthesize("qwen3", tmp_path / "qwen3", preset="tiny")["path"]
    r = CliRunner().invoke(main, ["eval", "expert-load", dense, "-o", str(tmp_path / "dense.json"), "--tokens", "64", "--ctx", "64"])
    assert r.exit_code == 1 and "has no MoE layers" in r.output and not (tmp_path / "dense.json").exists()
