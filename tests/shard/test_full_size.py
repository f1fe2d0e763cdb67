"""Released models' full widths (synth's presets, sparse files: real headers, no data): which splits are legal, what ranks hold."""

from __future__ import annotations

import pytest

from quantkit.checkpoint import Checkpoint
from quantkit.writer import plan_shards
from quantkit.shard import Parallel, ShardError, build, shard

from .tiny import sparse


def _sparse_source(tmp_path, family: str, preset: str, layers: int | None = None, to: str | None = None) -> Checkpoint:
    from quantkit.synth import plan

    s = plan(family, preset, layers)
    src = sparse(tmp_path / preset, plan_shards(s.specs, 5 * 10**9), s.config)
    if to is None:
        return Checkpoint(src)
    from quantkit.converters import ConvertOptions, make_plan

    p = make_plan(str(src), ConvertOptions(to=to))
    return Checkpoint(sparse(tmp_path / f"{preset}-{to}", p.shards, p.config))


def test_gpt_oss_120b_ep16(tmp_path):
    src = _sparse_source(tmp_path, "gpt-oss", "gpt-oss-120b")
    for tp in (1, 2, 4, 8):
        rep = shard(src.root, tmp_path / "o", ep=16, tp=tp, dry_run=True)
        assert (rep["moe_layers"], rep["n_routed_experts"]) == (36, 128)
        assert rep["bytes_written"] == rep["source_bytes"]  # 8 KV heads: no replication up to TP 8
    plan = build(src, Parallel.make(16, 8))
    r5 = {p.name: p for p in plan.rank_pieces(5)}
    assert r5["model.layers.0.mlp.experts.gate_up_proj_blocks"].shape == (8, 5760, 90, 16)  # 128 / 16 experts
    assert r5["model.layers.0.mlp.experts.gate_up_proj_blocks"].experts == tuple(range(40, 48))
    assert r5["model.layers.0.self_attn.k_proj.weight"].shape == (64, 2880)  # one of 8 KV heads
    assert r5["model.layers.0.self_attn.sinks"].shape == (8,)
    assert r5["lm_head.weight"].shape == (201088 // 8, 2880)


def test_gpt_oss_120b_fp8_tp8_refused(tmp_path):
    """FP8-block attention: 8 KV heads x 64 rows at TP 8 is 64 rows per rank, half a tile; TP 4 works."""
    src = _sparse_source(tmp_path, "gpt-oss", "gpt-oss-120b", layers=1, to="fp8-block")
    with pytest.raises(ShardError, match=r"k_proj\.weight: output rows \(8 KV heads\) 512 / tp 8 = 64 is not a multiple of 128 .*use --tp <= 4"):
        build(src, Parallel.make(16, 8))
    build(src, Parallel.make(16, 4))


def test_deepseek_v3_ep16(tmp_path):
    """5 layers: 0-2 dense, 3-4 MoE, MTP layer 5 (MoE). Every FP8 TP split of the real widths is tile-aligned up to TP 16."""
    src = _sparse_source(tmp_path, "deepseek-v3", "deepseek-v3", layers=5)
    rep1 = shard(src.root, tmp_path / "o", ep=16, dry_run=True)
    assert rep1["moe_layers"] == 3 and rep1["groups"]["shared"]["ranks"] == 16
    vocab = 2 * 129280 * 7168 * 2 * 2  # embed + lm_head, and the MTP layer's own pair, BF16
    assert rep1["groups"]["shared"]["bytes"] > vocab  # written once, hard-linked 16 times
    for tp in (2, 4, 8, 16):
        rep = shard(src.root, tmp_path / "o", ep=16, tp=tp, dry_run=True)
        assert rep["bytes_written"] == rep["source_bytes"] and rep["max_rank_bytes"] < rep1["max_rank_bytes"]
    plan = build(src, Parallel.make(16, 8))
    r9 = {p.name: p for p in plan.rank_pieces(9)}  # dp 1, tp 1
    assert r9["model.layers.3.self_attn.q_b_proj.weight_scale_inv"].shape == (24, 12)  # 128 heads x 192 rows / 8 = 3072 rows
    assert (r9["model.layers.3.self_attn.o_proj.weight"].start, r9["model.layers.3.self_attn.o_proj.weight"].stop) == (2048, 4096)
    assert r9["model.layers.3.self_attn.kv_a_proj_with_mqa.weight_scale_inv"].dim is None  # 576 rows, 5 tiles, replicated
    assert "model.layers.5.mlp.experts.159.down_proj.weight" in r9 and "model.layers.5.mlp.experts.160.down_proj.weight" not in r9


def test_qwen3_235b_fp8_at_tp8_and_16(tmp_path):
    """REFERENCE.md's trap (moe_intermediate 1536 / 8 = 192) does not apply: experts are EP-placed, never TP-split.
    Its 4 KV heads are replicated at TP 8 and 16 (one 128-row head per rank: tile-aligned)."""
    src = _sparse_source(tmp_path, "qwen3-moe", "qwen3-235b-a22b", layers=2, to="fp8-block")
    for tp, copies in ((8, 2), (16, 4)):
        plan = build(src, Parallel.make(16, tp))
        k = [p for p in plan.rank_pieces(tp - 1) if p.name == "model.layers.1.self_attn.k_proj.weight"][0]
        assert (k.start, k.stop) == (384, 512) and k.shape == (128, 4096)
        rep = shard(src.root, tmp_path / "o", ep=16, tp=tp, dry_run=True)
        kv = sum(Checkpoint(src.root).info(f"model.layers.{i}.self_attn.{x}_proj.{p}").nbytes
                 for i in range(2) for x in "kv" for p in ("weight", "weight_scale_inv"))
        assert rep["bytes_written"] == rep["source_bytes"] + (copies - 1) * kv  # each TP group writes its KV head


@pytest.mark.slow
def test_deepseek_v3_671b_full_depth(tmp_path):
    src = _sparse_source(tmp_path, "deepseek-v3", "deepseek-v3")
    rep = shard(src.root, tmp_path / "o", ep=16, tp=8, dry_run=True)
    assert rep["moe_layers"] == 59 and rep["n_routed_experts"] == 256  # layers 3..60 and the MTP layer 61
