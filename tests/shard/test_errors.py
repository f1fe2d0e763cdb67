"""Every refusal of ``quantkit shard``: a clear message naming the tensor, option or file, and nothing written."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.checkpoint import Checkpoint, CheckpointError
from quantkit.shard import Parallel, ShardError, build, shard
from quantkit.shard.geometry import check_scale_shape, scale_blocks

from .tiny import build as build_tiny
from .tiny import write

def _edited(tmp_path, family: str, fmt: str, tensors: dict, config: dict | None = None):
    """The tiny ``family`` checkpoint in ``fmt`` with ``tensors`` replaced (None: removed) and ``config`` merged in."""
    src = Checkpoint(build_tiny(family, fmt, tmp_path / "whole"))
    ts = {n: src.get(n) for n in src.names()}
    for n, t in tensors.items():
        if t is None:
            del ts[n]
        else:
            ts[n] = t
    return Checkpoint(write(tmp_path / "src", ts, src.config | (config or {})))


def test_scale_without_weight(tmp_path):
    """The config check finds the weight missing before any split is planned."""
    ck = _edited(tmp_path, "qwen3", "fp8-block", {"model.layers.0.mlp.down_proj.weight": None})
    with pytest.raises(CheckpointError, match="tensor 'model.layers.0.mlp.down_proj.weight' is missing; the config implies"):
        build(ck, Parallel.make(2, 2))


def test_scale_that_does_not_fit_its_weight(tmp_path):
    ck = _edited(tmp_path, "qwen3-moe", "fp8-block", {"model.layers.0.self_attn.o_proj.weight_scale_inv": torch.ones(2, 3)})
    with pytest.raises(ShardError, match=r"scale shape \[2, 3\] does not fit weight \[256, 512\] in 128x128 blocks \(expected \[2, 4\]\)"):
        build(ck, Parallel.make(2, 2))


def test_heads_missing_from_config(tmp_path):
    src = build_tiny("qwen3", "bf16", tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    del cfg["num_attention_heads"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="num_attention_heads is missing; a qwen3 config needs it"):
        build(Checkpoint(src), Parallel.make(2, 2))


def test_uneven_vocab(tmp_path):
    odd = torch.zeros(15, 256, dtype=torch.bfloat16)
    ck = _edited(tmp_path, "qwen3", "bf16", {"model.embed_tokens.weight": odd, "lm_head.weight": odd}, {"vocab_size": 15})
    with pytest.raises(ShardError, match="model.embed_tokens.weight: output rows 15 / tp 2 is not a whole number"):
        build(ck, Parallel.make(2, 2))


def test_scale_dtype_and_mx_k():
    with pytest.raises(ShardError, match="scale dtype I32 is neither"):
        scale_blocks("I32", "x.weight_scale")
    with pytest.raises(ShardError, match="K=48 is not a multiple of 32"):
        check_scale_shape("x.weight_scale", (4, 1), (4, 48), (1, 32))


def test_missing_experts(tmp_path):
    src = build_tiny("deepseek-v3", "bf16", tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(cfg | {"n_routed_experts": 16}))
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.gate.weight' has shape \[8, 256\]; the config implies \[16, 256\]"):
        build(Checkpoint(src), Parallel.make(2))
    del cfg["n_routed_experts"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="n_routed_experts / num_local_experts is missing"):
        build(Checkpoint(src), Parallel.make(2))


def test_original_layout_refused(tmp_path):
    from quantkit.synth import synthesize

    synthesize("gpt-oss", tmp_path / "src", preset="tiny", layers=1, layout="original")
    with pytest.raises(ShardError, match="shard reads the HF root layout, not GPT-OSS's original/ folder"):
        shard(tmp_path / "src", tmp_path / "out", ep=2)
    assert not (tmp_path / "out").exists()


def test_hard_link_failure_is_loud(tmp_path, monkeypatch):
    import os

    src = build_tiny("qwen3", "bf16", tmp_path / "src")

    def no_links(a, b):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(ShardError, match="cannot hard-link model-shared-00001-of-00001.safetensors.*--no-hardlinks"):
        shard(src, tmp_path / "out", ep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    shard(src, tmp_path / "out", ep=2, hardlinks=False, verify_output=True)


def test_workers_must_be_positive(tmp_path):
    with pytest.raises(ShardError, match="--workers must be at least 1"):
        shard(build_tiny("qwen3", "bf16", tmp_path / "src"), tmp_path / "out", ep=2, workers=0)
