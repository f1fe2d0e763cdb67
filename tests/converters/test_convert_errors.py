"""Every rejected input: one clear message, a non-zero exit, the source untouched, no DST and no
partial directory left behind (through the CLI, as a user meets them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main

from .support import copy_ckpt, dir_digest, edit_config, rewrite


def fails(src: Path, dst: Path, *args: str, match: str) -> None:
    before = dir_digest(src)
    r = CliRunner().invoke(main, ["convert", str(src), str(dst), *args])
    assert r.exit_code != 0, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), f"traceback instead of a message: {r.exception!r}"
    assert match in r.output, r.output
    assert dir_digest(src) == before, "the source changed"
    assert not (dst.parent / f".{dst.name}.quantkit-partial").exists(), "a partial directory was left behind"


def broken(synth, tmp_path: Path, family: str, edit: Callable[[dict], None]) -> Path:
    src = copy_ckpt(synth(family), tmp_path / "src")
    rewrite(src, edit)
    return src


def test_unknown_architecture(synth, tmp_path) -> None:
    src = copy_ckpt(synth("qwen3"), tmp_path / "src")
    edit_config(src, lambda c: c.update(architectures=["LlamaForCausalLM"]))
    fails(src, tmp_path / "o", "--to", "fp8-block", match="not supported; supported: DeepseekV3ForCausalLM, GptOssForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("family, edit, match", [
    ("qwen3", lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"), "tensor 'model.layers.1.self_attn.k_proj.weight' is missing; the config implies [128, 256]"),
    ("deepseek-v3", lambda t: t.pop("model.layers.0.self_attn.o_proj.weight_scale_inv"), "has no block scale 'model.layers.0.self_attn.o_proj.weight_scale_inv'"),
    ("gpt-oss", lambda t: t.pop("model.layers.1.mlp.experts.down_proj_scales"), "'model.layers.1.mlp.experts.down_proj_scales' (MXFP4 scales) is missing"),
    ("qwen3", lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(4, 4)}), "tensor 'model.layers.0.mlp.extra.weight' is not one the config implies for qwen3"),
    ("deepseek-v3", lambda t: t.update({"model.layers.0.mlp.gate_proj.weight": t["model.layers.0.mlp.gate_proj.weight"].bfloat16()}),
     "'model.layers.0.mlp.gate_proj.weight' (fp8-block weight (quantization_config fp8)) is BF16; expected F8_E4M3"),
    ("qwen3", lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.int32)}), "'model.norm.weight' (float tensor) is I32"),
    ("gpt-oss", lambda t: t.update({"model.layers.0.mlp.experts.gate_up_proj_bias": torch.zeros(8, 3, dtype=torch.bfloat16)}),
     "tensor 'model.layers.0.mlp.experts.gate_up_proj_bias' has shape [8, 3]; the config implies [8, 512]"),
    ("deepseek-v3", lambda t: t.update({"model.layers.1.self_attn.kv_b_proj.weight_scale_inv": torch.ones(1, 1)}), "kv_b_proj.weight_scale_inv' (128x128 block scale of"),
])
def test_bad_tensors(synth, tmp_path, family, edit, match) -> None:
    fails(broken(synth, tmp_path, family, edit), tmp_path / "o", "--to", "mxfp8", match=match)


def test_wrong_shape_names_the_config_shape(synth, tmp_path) -> None:
    def grow(t: dict) -> None:
        t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(128, 256, dtype=torch.bfloat16)

    fails(broken(synth, tmp_path, "qwen3", grow), tmp_path / "o", "--to", "bf16",
          match="tensor 'model.layers.0.self_attn.q_proj.weight' has shape [128, 256]; the config implies [256, 256]")


def test_truncated_shard(synth, tmp_path) -> None:
    src = copy_ckpt(synth("qwen3"), tmp_path / "src")
    (shard,) = src.glob("*.safetensors")
    shard.write_bytes(shard.read_bytes()[:-1000])
    fails(src, tmp_path / "o", "--to", "fp8-block", match="truncated")


def test_dst_exists_without_force(synth, tmp_path) -> None:
    dst = tmp_path / "o"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    fails(synth("qwen3"), dst, "--to", "fp8-block", match="already exists: pass --force")
    assert (dst / "keep.txt").read_text() == "mine"


def test_mx_block_that_does_not_divide(tmp_path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=128, hidden_size=80, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=40)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "src")
    fails(tmp_path / "src", tmp_path / "o", "--to", "mxfp8",
          match="model.layers.0.self_attn.q_proj.weight: K=80 is not a multiple of 32")
    # fp8-block has a rule for partial tiles, so the same checkpoint converts
    r = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(tmp_path / "b"), "--to", "fp8-block"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, match", [
    (["--to", "fp8-block", "--seed", "3"], "--seed only applies with --rounding stochastic"),
    (["--to", "mxfp8", "--scale-fmt", "ue8m0"], "--scale-fmt applies to --to fp8-block only"),
    (["--to", "fp8-block", "--scale-rule", "floor"], "--scale-rule does not apply"),
    (["--to", "bf16", "--ignore", "*"], "--ignore applies to quantized targets"),
    (["--to", "fp8-block", "--ignore", "model.layers.*.mlp.router"], "--ignore 'model.layers.*.mlp.router' matches no weight"),
    (["--to", "fp8-block", "--max-shard-size", "lots"], "cannot read size 'lots'"),
    (["--to", "fp8-block", "--resume", "--dry-run"], "--resume and --dry-run exclude each other"),
])
def test_contradicting_options(synth, tmp_path, args, match) -> None:
    fails(synth("qwen3"), tmp_path / "o", *args, match=match)
    assert not (tmp_path / "o").exists()


def test_dst_inside_src(synth, tmp_path) -> None:
    src = copy_ckpt(synth("qwen3"), tmp_path / "src")
    fails(src, src / "out", "--to", "bf16", match="may not be the source, inside it, or contain it")
