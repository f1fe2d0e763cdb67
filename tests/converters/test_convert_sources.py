"""Less common sources: Qwen's own FP8 block release (scales in another dtype), transformers' BF16
GPT-OSS, and the command line's report, JSON and dry run."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.formats import fp8_block, mxfp8

from .support import copy_ckpt, edit_config, rewrite, run, shard_bytes, tensors


def test_qwen_fp8_release_with_bf16_scales(synth, tmp_path) -> None:
    run(synth("qwen3-moe"), tmp_path / "fp8", to="fp8-block")
    src = copy_ckpt(tmp_path / "fp8", tmp_path / "src")

    def bf16_scales(t: dict) -> None:
        for k in [k for k in t if k.endswith("_scale_inv")]:
            t[k] = t[k].to(torch.bfloat16)

    rewrite(src, bf16_scales)
    edit_config(src, lambda c: c["quantization_config"].update(modules_to_not_convert=["lm_head"]))
    s = tensors(src)
    run(src, tmp_path / "bf16", to="bf16")
    run(src, tmp_path / "same", to="fp8-block")
    b, same = tensors(tmp_path / "bf16"), tensors(tmp_path / "same")
    p = "model.layers.1.mlp.experts.5.down_proj.weight"
    want = fp8_block.dequantize_weight(s[p], s[p + "_scale_inv"].float()).to(torch.bfloat16)
    assert torch.equal(b[p], want)
    assert same[p + "_scale_inv"].dtype == torch.float32 and torch.equal(same[p + "_scale_inv"], s[p + "_scale_inv"].float())
    assert torch.equal(same[p].view(torch.uint8), s[p].view(torch.uint8))
    m = json.loads((tmp_path / "same" / "quantkit.json").read_text())["tensors"]
    assert m[p]["path"] == "copy-fp8-block"


def test_transformers_bf16_gpt_oss_requantizes_to_the_same_bytes(synth, tmp_path) -> None:
    src = synth("gpt-oss", "tiny-ragged")
    run(src, tmp_path / "direct", to="fp8-block")
    run(src, tmp_path / "bf16", to="bf16")  # MXFP4 -> BF16 is exact, so BF16 -> fp8-block sees the same values
    run(tmp_path / "bf16", tmp_path / "via", to="fp8-block")  # reads [E, H, 2I] as [E, 2I, H]
    assert shard_bytes(tmp_path / "via") == shard_bytes(tmp_path / "direct")
    m = json.loads((tmp_path / "via" / "quantkit.json").read_text())["tensors"]
    assert m["model.layers.0.mlp.experts.gate_up_proj"]["path"] == "quantize"
    # mxfp8: the exact path keeps MXFP4's scales, quantize picks its own; the values are the same
    run(src, tmp_path / "mx-direct", to="mxfp8")
    run(tmp_path / "bf16", tmp_path / "mx-via", to="mxfp8")
    a, b = tensors(tmp_path / "mx-direct"), tensors(tmp_path / "mx-via")
    p = "model.layers.1.mlp.experts.down_proj"
    assert torch.equal(mxfp8.dequantize(a[p], a[p + "_scale"]), mxfp8.dequantize(b[p], b[p + "_scale"]))


def test_cli_report_json_and_dry_run(synth, tmp_path) -> None:
    src = synth("deepseek-v3")
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "dry"), "--to", "mxfp8", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["dry_run"] and rep["paths"]["fp8-block->mxfp8"]["tensors"] > 0 and rep["output"]["shards"] == 1
    assert not (tmp_path / "dry").exists() and not (tmp_path / ".dry.quantkit-partial").exists()
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "o"), "--to", "bf16"])
    assert r.exit_code == 0, r.output
    assert "| dequantize |" in r.stdout and "| copy |" in r.stdout and "# quantkit convert: deepseek-v3" in r.stdout
    assert r.stderr == ""  # progress goes to stderr: off a terminal a line every 5 s, so none for a short run
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "j"), "--to", "fp8-block", "--json"])
    rep = json.loads(r.stdout)
    assert rep["paths"]["copy-fp8-block"]["exact_path"] and rep["run"]["backends"] == {"*": "torch (formats/ reference)"}
    assert rep["tensors"]["model.layers.0.self_attn.kv_b_proj.weight"]["exact_share"] == 1.0
