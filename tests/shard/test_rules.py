"""Split tables and TP geometry against the references: DeepSeek-V3 convert.py, transformers' TP plans, vLLM's KV rule."""

from __future__ import annotations

import pytest
import torch

from quantkit.checkpoint import Checkpoint
from quantkit.shard import Parallel, ShardError, build
from quantkit.shard.geometry import split, tp_ranges
from quantkit.shard.rules import match, table

from .tiny import build as build_tiny

# DeepSeek-V3 inference/convert.py, verbatim: HF module key -> (their name, split dim)
CONVERT_PY_MAPPING = {
    "embed_tokens": ("embed", 0), "input_layernorm": ("attn_norm", None), "post_attention_layernorm": ("ffn_norm", None),
    "q_proj": ("wq", 0), "q_a_proj": ("wq_a", None), "q_a_layernorm": ("q_norm", None), "q_b_proj": ("wq_b", 0),
    "kv_a_proj_with_mqa": ("wkv_a", None), "kv_a_layernorm": ("kv_norm", None), "kv_b_proj": ("wkv_b", 0),
    "o_proj": ("wo", 1), "gate": ("gate", None), "gate_proj": ("w1", 0), "down_proj": ("w2", 1), "up_proj": ("w3", 0),
    "norm": ("norm", None), "lm_head": ("head", 0), "scale": ("scale", None),
}


def convert_py_state_dicts(ck: Checkpoint, n_experts: int, mp: int, mtp_layer: int) -> list[dict[str, torch.Tensor]]:
    """DeepSeek's convert.py split loop (set_param), kept on HF names so results compare by name."""
    n_local = n_experts // mp
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(mp)]
    for hf in ck.names():
        if f"model.layers.{mtp_layer}" in hf:  # convert.py drops the MTP layer
            continue
        name = hf[len("model."):] if hf.startswith("model.") else hf
        name = name.replace("self_attn", "attn").replace("mlp", "ffn")
        name = name.replace("weight_scale_inv", "scale").replace("e_score_correction_bias", "bias")
        _, dim = CONVERT_PY_MAPPING[name.split(".")[-2]]
        param = ck.get(hf)
        for i in range(mp):
            new = param
            if "experts" in name and "shared_experts" not in name:
                idx = int(name.split(".")[-3])
                if idx < i * n_local or idx >= (i + 1) * n_local:
                    continue
            elif dim is not None:
                assert param.size(dim) % mp == 0
                size = param.size(dim) // mp
                new = param.narrow(dim, i * size, size).contiguous()
            out[i][hf] = new
    return out


# tiny shapes: 4-way TP of the FP8 source would cut 128-tiles, so mp 4 compares on a BF16 copy
@pytest.mark.parametrize("mp,fmt", [(2, "source"), (4, "bf16")])
def test_deepseek_matches_convert_py(tmp_path, mp, fmt):
    """EP = TP = mp (DP 1) is convert.py's deployment: every rank must hold exactly its tensors, bit for bit."""
    from quantkit.shard import shard

    src = Checkpoint(build_tiny("deepseek-v3", fmt, tmp_path / "src"))
    shard(src.root, tmp_path / "out", ep=mp, tp=mp)
    ref = convert_py_state_dicts(src, 8, mp, mtp_layer=2)
    for i in range(mp):
        ck = Checkpoint(tmp_path / "out" / f"rank-{i:05d}-of-{mp:05d}")
        ours = {n for n in ck.names() if not n.startswith("model.layers.2.")}
        assert ours == set(ref[i]), sorted(ours ^ set(ref[i]))[:5]
        for name, t in ref[i].items():
            got = ck.get(name)
            assert got.shape == t.shape and torch.equal(got.view(torch.uint8), t.contiguous().view(torch.uint8)), name


TP_PLAN_KINDS = {"colwise": "column", "rowwise": "row", "replicated_with_grad_allreduce": "replicate"}


@pytest.mark.parametrize("family,config_cls", [
    ("deepseek-v3", "DeepseekV3Config"), ("qwen3", "Qwen3Config"), ("qwen3-moe", "Qwen3MoeConfig"),
])
def test_tables_agree_with_transformers_tp_plan(family, config_cls):
    import transformers

    plan = getattr(transformers, config_cls).base_model_tp_plan
    checked = 0
    for key, style in plan.items():
        if ".experts" in key:  # transformers TP-splits experts; EP = DP x TP places them whole instead
            continue
        rule, _ = match(table(family), "model." + key.replace("*", "3") + ".weight")
        assert rule.kind == TP_PLAN_KINDS[style], key
        checked += 1
    assert checked >= 3


def test_unknown_tensor_is_refused():
    with pytest.raises(ShardError, match="model.layers.0.mlp.mystery.weight.*no qwen3 shard rule"):
        match(table("qwen3"), "model.layers.0.mlp.mystery.weight")


@pytest.mark.parametrize("tp,n_kv,want_heads", [(4, 2, [0, 0, 1, 1]), (8, 4, [0, 0, 1, 1, 2, 2, 3, 3]), (2, 4, None)])
def test_kv_heads_replicated_like_vllm(tp, n_kv, want_heads):
    """vLLM/SGLang: with tp > n_kv, rank t holds KV head t // (tp // n_kv); otherwise a plain head split."""
    hd = 128
    r = tp_ranges(n_kv * hd, tp, n_kv, kv=True)
    assert not isinstance(r, str)
    if want_heads is None:
        per = n_kv // tp * hd
        assert r == [(t * per, (t + 1) * per) for t in range(tp)]
    else:
        assert r == [(h * hd, (h + 1) * hd) for h in want_heads]


def test_tile_cut_refused_with_a_suggestion():
    """Qwen3-235B's trap (REFERENCE.md): 1536 / tp 8 = 192 cuts 128-tiles; TP 4 works."""
    with pytest.raises(ShardError) as e:
        split("model.layers.0.mlp.down_proj.weight", label="input columns", size=1536, units=None, kv=False,
              tp=8, ep=16, block=128, block_label="FP8-block 128x128 tiles")
    msg = str(e.value)
    assert "model.layers.0.mlp.down_proj.weight" in msg and "1536 / tp 8 = 192 is not a multiple of 128" in msg
    assert "use --tp <= 4" in msg


def test_heads_must_divide_tp():
    with pytest.raises(ShardError, match="5 heads / tp 2"):
        split("q", label="output rows", size=320, units=5, kv=False, tp=2, ep=2)


def test_fp8_block_tp_split_refused_on_checkpoint(tmp_path):
    """GPT-OSS tiny FP8: k_proj has 2 KV heads x 64 rows; TP 2 would give 64-row halves of a 128-tile."""
    src = Checkpoint(build_tiny("gpt-oss", "fp8-block", tmp_path / "src"))
    with pytest.raises(ShardError, match=r"k_proj\.weight: output rows \(2 KV heads\) 128 / tp 2 = 64 is not a multiple of 128"):
        build(src, Parallel.make(2, 2))
    build(Checkpoint(build_tiny("gpt-oss", "mxfp8", tmp_path / "mx")), Parallel.make(2, 2))  # MXFP8 blocks run along K: fine


def test_mxfp8_row_split_needs_32_columns(tmp_path):
    with pytest.raises(ShardError, match="not a multiple of 32 \\(MXFP8"):
        split("o", label="input columns", size=96, units=None, kv=False, tp=2, ep=2, block=32, block_label="MXFP8 1x32 blocks along K")


def test_parallel_sizes():
    p = Parallel.make(16, 2)
    assert (p.dp, p.world) == (8, 16)
    assert [(c.dp, c.tp, c.ep) for c in p.ranks()[:3]] == [(0, 0, 0), (0, 1, 1), (1, 0, 2)]
    assert p.tp_group(1) == tuple(range(1, 16, 2))
    with pytest.raises(ShardError, match="must equal --dp x --tp"):
        Parallel.make(16, 2, 4)
    with pytest.raises(ShardError, match="not a multiple of --tp"):
        Parallel.make(6, 4)
    with pytest.raises(ShardError, match="at least 1"):
        Parallel.make(0)
