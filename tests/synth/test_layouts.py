"""Names, dtypes and shapes of synthetic checkpoints against REFERENCE.md's tables (tests/synth/expected.py)."""

from __future__ import annotations

import json

import pytest

from quantkit.checkpoint import DTYPE_NAMES, Checkpoint
from quantkit.inspect import inspect
from quantkit.synth import plan

from . import expected

FAMILIES = ["gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe"]


def _table(ck: Checkpoint) -> dict:
    return {t.name: (t.dtype, t.shape) for t in ck.tensors.values()}


def _diff(got: dict, want: dict) -> str:
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    wrong = [f"{n}: {got[n]} != {want[n]}" for n in sorted(set(got) & set(want)) if got[n] != want[n]]
    return f"missing {missing[:5]}, extra {extra[:5]}, wrong {wrong[:5]}"


@pytest.mark.parametrize("preset", ["tiny", "tiny-ragged"])
@pytest.mark.parametrize("family", FAMILIES)
def test_root_layout_matches_reference(synth_dir, family: str, preset: str) -> None:
    ck = Checkpoint(synth_dir(family, preset))
    want = expected.ROOT[family](ck.config)
    got = _table(ck)
    assert got == want, _diff(got, want)
    assert ck.layout == "root"


def test_gpt_oss_original_layout_alone(synth_dir) -> None:
    root = synth_dir("gpt-oss", layout="original")
    assert not list(root.glob("*.safetensors")), "the original layout is written alone"
    ck = Checkpoint(root)
    assert ck.layout == "original"
    ocfg = json.loads((root / "original" / "config.json").read_text())
    want = expected.gpt_oss_original(ocfg)
    assert _table(ck) == want, _diff(_table(ck), want)
    dtypes = json.loads((root / "original" / "dtypes.json").read_text())
    assert dtypes["block.0.mlp.mlp1_weight.blocks"] == "FP4" and dtypes["block.0.mlp.mlp1_weight.scales"] == "UE8"
    assert dtypes["block.1.attn.qkv.weight"] == "BF16" and set(dtypes) == set(want)
    assert ocfg["num_experts"] == ck.config["num_local_experts"] and ocfg["experts_per_token"] == ck.config["num_experts_per_tok"]


@pytest.mark.parametrize(("family", "preset"), [
    ("gpt-oss", "tiny"), ("gpt-oss", "tiny-ragged"), ("deepseek-v3", "tiny"), ("deepseek-v3", "tiny-ragged"),
    ("qwen3", "tiny"), ("qwen3-moe", "tiny"),
])
def test_inspect_finds_no_problem(synth_dir, family: str, preset: str) -> None:
    rep = inspect(str(synth_dir(family, preset)))
    assert rep.family == family and rep.problems == []
    want = {"gpt-oss": "mxfp4", "deepseek-v3": "fp8-block", "qwen3": "bf16", "qwen3-moe": "bf16"}[family]
    assert want in rep.formats


def test_inspect_reads_original_layout(synth_dir) -> None:
    rep = inspect(str(synth_dir("gpt-oss", layout="original")))
    assert rep.family == "gpt-oss" and rep.layout == "original" and rep.problems == []


# Full-size presets: planned (no values generated) and checked against the released shapes.
FULL = [
    ("gpt-oss", "gpt-oss-20b", {"num_hidden_layers": 24, "num_local_experts": 32, "hidden_size": 2880, "vocab_size": 201088},
     {"model.layers.23.mlp.experts.gate_up_proj_blocks": (32, 5760, 90, 16), "model.layers.0.self_attn.q_proj.weight": (4096, 2880),
      "model.layers.0.self_attn.sinks": (64,)}),
    ("gpt-oss", "gpt-oss-120b", {"num_hidden_layers": 36, "num_local_experts": 128, "num_experts_per_tok": 4},
     {"model.layers.35.mlp.experts.down_proj_blocks": (128, 2880, 90, 16), "model.layers.0.self_attn.k_proj.weight": (512, 2880)}),
    ("deepseek-v3", "deepseek-v3", {"num_hidden_layers": 61, "n_routed_experts": 256, "first_k_dense_replace": 3, "vocab_size": 129280},
     {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (576, 7168), "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv": (5, 56),
      "model.layers.0.self_attn.q_b_proj.weight": (24576, 1536), "model.layers.61.eh_proj.weight": (7168, 14336),
      "model.layers.60.mlp.experts.255.down_proj.weight": (7168, 2048), "model.layers.2.mlp.down_proj.weight": (7168, 18432)}),
    ("qwen3", "qwen3-8b", {"num_hidden_layers": 36, "hidden_size": 4096, "vocab_size": 151936},
     {"model.layers.0.mlp.gate_proj.weight": (12288, 4096), "model.layers.0.self_attn.k_norm.weight": (128,)}),
    ("qwen3-moe", "qwen3-30b-a3b", {"num_hidden_layers": 48, "num_experts": 128, "moe_intermediate_size": 768},
     {"model.layers.47.mlp.experts.127.gate_proj.weight": (768, 2048), "model.layers.0.self_attn.q_proj.weight": (4096, 2048)}),
    ("qwen3-moe", "qwen3-235b-a22b", {"num_hidden_layers": 94, "moe_intermediate_size": 1536, "num_attention_heads": 64},
     {"model.layers.0.self_attn.q_proj.weight": (8192, 4096), "model.layers.93.mlp.experts.0.down_proj.weight": (4096, 1536)}),
]


@pytest.mark.parametrize(("family", "preset", "config", "shapes"), FULL, ids=[f[1] for f in FULL])
def test_full_size_plan_matches_release(family: str, preset: str, config: dict, shapes: dict) -> None:
    s = plan(family, preset)
    for k, v in config.items():
        assert s.config[k] == v, k
    got = {sp.name: (DTYPE_NAMES[sp.dtype], sp.shape) for sp in s.specs}
    want = expected.ROOT[family](s.config)
    assert got == want, _diff(got, want)
    for name, shape in shapes.items():
        assert got[name][1] == shape, name


def test_layers_cuts_depth_and_keeps_mtp() -> None:
    s = plan("deepseek-v3", "deepseek-v3", layers=1)
    names = {sp.name for sp in s.specs}
    assert s.config["num_hidden_layers"] == 1
    assert "model.layers.1.shared_head.head.weight" in names and not any(n.startswith("model.layers.2.") for n in names)
    g = plan("gpt-oss", "gpt-oss-20b", layers=3)
    assert g.config["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]


def test_sharded_original_layout_has_its_own_index(tmp_path, synth_dir) -> None:
    from quantkit.synth import synthesize

    dst = tmp_path / "orig"
    synthesize("gpt-oss", dst, layout="original", max_shard_size="1MB")
    files = sorted(p.name for p in (dst / "original").glob("*.safetensors"))
    assert len(files) > 2 and (dst / "original" / "model.safetensors.index.json").exists()
    assert not (dst / "model.safetensors.index.json").exists()
    manifest = json.loads((dst / "quantkit.json").read_text())
    assert all(f"original/{f}" in manifest["files"] for f in files)
    a, b = Checkpoint(dst), Checkpoint(synth_dir("gpt-oss", layout="original"))
    assert _table(a) == _table(b)
    assert a.get("block.1.mlp.mlp1_weight.blocks").equal(b.get("block.1.mlp.mlp1_weight.blocks"))


def _linear_dims(ck: Checkpoint) -> list[tuple[str, int, int]]:
    """(name, out, in) of every projection weight (MXFP4 blocks unpacked; embeddings and routers excluded)."""
    out = []
    for t in ck.tensors.values():
        if any(x in t.name for x in ("embed", "lm_head", "router", "mlp.gate.weight", "norm")):
            continue
        if t.name.endswith("_blocks"):
            out.append((t.name, t.shape[-3], t.shape[-2] * 32))
        elif t.name.endswith("weight") and len(t.shape) == 2:
            out.append((t.name, *t.shape))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_linear_dims_are_whole_tiles(synth_dir, family: str) -> None:
    """tiny keeps every projection in whole 128x128 tiles (transformers' CPU FP8 dequantizer needs that); tiny-ragged does not."""
    tiny = _linear_dims(Checkpoint(synth_dir(family)))
    assert len(tiny) >= 8 and all(n % 128 == 0 and k % 128 == 0 for _, n, k in tiny), [d for d in tiny if d[1] % 128 or d[2] % 128]
    assert any(n % 128 or k % 128 for _, n, k in _linear_dims(Checkpoint(synth_dir(family, "tiny-ragged"))))
