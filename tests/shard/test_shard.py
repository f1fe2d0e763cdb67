"""Shard every family and format, verify byte-for-byte reassembly, and check the on-disk layout."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from quantkit.checkpoint import Checkpoint
from quantkit.shard import ShardError, shard, verify

from .tiny import build as build_tiny

FAMILIES = ("gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe")
FORMATS = ("source", "fp8-block", "mxfp8", "bf16")
# synth tiny shapes where TP 2 would cut a 128-tile of an FP8-block weight (refused, with the tensor named)
TP2_CUTS_TILES = {
    ("gpt-oss", "fp8-block"): r"self_attn\.k_proj\.weight: output rows \(2 KV heads\) 128 / tp 2 = 64",
    ("qwen3", "fp8-block"): r"self_attn\.k_proj\.weight: output rows \(2 KV heads\) 128 / tp 2 = 64",
    ("deepseek-v3", "source"): r"shared_experts\.gate_proj\.weight: output rows 128 / tp 2 = 64",
    ("deepseek-v3", "fp8-block"): r"shared_experts\.gate_proj\.weight: output rows 128 / tp 2 = 64",
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Hand-built tiny checkpoints (tests/shard/tiny.py) for tests that check literal slices."""
    root = tmp_path_factory.mktemp("src")
    cache: dict[tuple[str, str], Checkpoint] = {}

    def get(family: str, fmt: str) -> Checkpoint:
        if (family, fmt) not in cache:
            cache[(family, fmt)] = Checkpoint(build_tiny(family, fmt, root / f"{family}-{fmt}"))
        return cache[(family, fmt)]

    yield get
    shutil.rmtree(root, ignore_errors=True)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (random bytes include NaNs, which torch.equal calls unequal)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _shard_and_check(src: Checkpoint, dst, ep: int, tp: int, placement: str) -> None:
    rep = shard(src.root, dst, ep=ep, tp=tp, placement=placement, verify_output=True)
    assert rep["verify"]["ok"] and rep["verify"]["tensors"] == len(src.names())
    assert rep["verify"]["bytes_compared"] >= src.total_bytes()
    _check_layout(src, dst, ep, tp)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_and_format_reassembles(synth_ckpt, tmp_path, family, fmt):
    """synth tiny (+ convert): EP 2, then EP 4 x TP 2 (or EP 4 x TP 1 where TP 2 is refused), verified."""
    src = synth_ckpt(family, fmt)
    _shard_and_check(src, tmp_path / "ep2", 2, 1, "contiguous")
    cut = TP2_CUTS_TILES.get((family, fmt))
    if cut is None:
        _shard_and_check(src, tmp_path / "ep4-tp2", 4, 2, "round-robin")
        return
    with pytest.raises(ShardError, match=cut + r" is not a multiple of 128 \(FP8-block 128x128 tiles\): use --tp <= 1"):
        shard(src.root, tmp_path / "ep4-tp2", ep=4, tp=2)
    assert not (tmp_path / "ep4-tp2").exists()
    _shard_and_check(src, tmp_path / "ep4-tp1", 4, 1, "round-robin")


@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_sources_reassemble(synth_ckpt, tmp_path, family):
    """tiny-ragged: partial 128-tiles (DeepSeek's 576-row kv_a_proj in miniature) stay whole or split on tiles."""
    src = synth_ckpt(family, "source", "tiny-ragged")
    _shard_and_check(src, tmp_path / "ep2", 2, 1, "contiguous")
    if family == "qwen3-moe":
        _shard_and_check(src, tmp_path / "ep4-tp2", 4, 2, "contiguous")


def _check_layout(src: Checkpoint, dst, ep: int, tp: int) -> None:
    man = json.loads((dst / "quantkit.json").read_text())
    assert man["parallel"] == {"world_size": ep, "ep": ep, "tp": tp, "dp": ep // tp}
    assert man["source"]["fingerprint"] == src.fingerprint()
    shared = man["groups"]["shared"]["files"]
    for r in range(ep):
        ck = Checkpoint(dst / f"rank-{r:05d}-of-{ep:05d}")
        meta = ck.config["quantkit_shard"]
        assert (meta["rank"], meta["dp_rank"], meta["tp_rank"], meta["ep_rank"]) == (r, r // tp, r % tp, r)
        assert {k: v for k, v in ck.config.items() if k != "quantkit_shard"} == src.config
        assert src.side_files()
        for side in src.side_files():  # tokenizer files etc. beside every rank's weights
            assert (ck.root / side.name).read_bytes() == side.read_bytes()
        for f in shared:  # one inode shared by every rank
            assert os.stat(ck.dir / f).st_nlink == ep and os.path.samefile(ck.dir / f, dst / f"rank-00000-of-{ep:05d}" / f)


def test_tp_groups_are_linked_across_dp(sources, tmp_path):
    src = sources("qwen3-moe", "bf16")
    shard(src.root, tmp_path / "o", ep=4, tp=2)
    man = json.loads((tmp_path / "o" / "quantkit.json").read_text())
    assert man["groups"]["tp00001"]["ranks"] == [1, 3]
    f = man["groups"]["tp00001"]["files"][0]
    assert os.path.samefile(tmp_path / "o" / "rank-00001-of-00004" / f, tmp_path / "o" / "rank-00003-of-00004" / f)
    assert not (tmp_path / "o" / "rank-00000-of-00004" / f).exists()
    assert man["replicated_storage"] == "hardlink"


def test_copies_instead_of_links(sources, tmp_path):
    src = sources("qwen3", "source")
    shard(src.root, tmp_path / "o", ep=2, hardlinks=False, verify_output=True)
    man = json.loads((tmp_path / "o" / "quantkit.json").read_text())
    f = man["groups"]["shared"]["files"][0]
    assert os.stat(tmp_path / "o" / "rank-00001-of-00002" / f).st_nlink == 1
    assert man["replicated_storage"] == "copy"


def test_gpt_oss_fused_experts_local_order(sources, tmp_path):
    """Round-robin on 4 ranks: rank 1 holds global experts 1 and 5 at local indices 0 and 1."""
    src = sources("gpt-oss", "source")
    shard(src.root, tmp_path / "o", ep=4, placement="round-robin")
    ck = Checkpoint(tmp_path / "o" / "rank-00001-of-00004")
    name = "model.layers.1.mlp.experts.gate_up_proj_blocks"
    assert ck.config["quantkit_shard"]["splits"][name]["experts"] == [1, 5]
    assert ck.config["quantkit_shard"]["experts"]["1"] == [1, 5]
    assert same(ck.get(name), src.get(name)[[1, 5]])
    assert same(ck.get("model.layers.1.mlp.experts.down_proj_bias"), src.get("model.layers.1.mlp.experts.down_proj_bias")[[1, 5]])
    man = json.loads((tmp_path / "o" / "quantkit.json").read_text())
    assert man["experts"]["map"]["1"] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_gpt_oss_sinks_and_biases_follow_heads(sources, tmp_path):
    src = sources("gpt-oss", "bf16")
    shard(src.root, tmp_path / "o", ep=2, tp=2)
    r1 = Checkpoint(tmp_path / "o" / "rank-00001-of-00002")
    p = "model.layers.0.self_attn"
    assert same(r1.get(f"{p}.sinks"), src.get(f"{p}.sinks")[2:4])  # q heads 2, 3
    assert same(r1.get(f"{p}.q_proj.bias"), src.get(f"{p}.q_proj.bias")[128:256])
    assert same(r1.get(f"{p}.o_proj.weight"), src.get(f"{p}.o_proj.weight")[:, 128:256])
    assert same(r1.get(f"{p}.o_proj.bias"), src.get(f"{p}.o_proj.bias"))  # row-parallel bias: whole
    assert same(r1.get("model.layers.0.mlp.router.weight"), src.get("model.layers.0.mlp.router.weight"))


def test_kv_heads_replicated_beyond_their_count(sources, tmp_path):
    """2 KV heads at TP 4: ranks 0, 1 hold head 0 and ranks 2, 3 head 1; q is split four ways."""
    src = sources("qwen3", "bf16")
    shard(src.root, tmp_path / "o", ep=4, tp=4, verify_output=True)
    k = src.get("model.layers.1.self_attn.k_proj.weight")
    for r, head in enumerate([0, 0, 1, 1]):
        ck = Checkpoint(tmp_path / "o" / f"rank-{r:05d}-of-00004")
        assert same(ck.get("model.layers.1.self_attn.k_proj.weight"), k[head * 64:(head + 1) * 64])
        assert ck.info("model.layers.1.self_attn.q_proj.weight").shape == (64, 256)


def test_deepseek_fp8_scales_split_with_weights(sources, tmp_path):
    src = sources("deepseek-v3", "source")
    shard(src.root, tmp_path / "o", ep=2, tp=2)
    r1 = Checkpoint(tmp_path / "o" / "rank-00001-of-00002")
    a = "model.layers.1.self_attn"
    assert same(r1.get(f"{a}.q_b_proj.weight_scale_inv"), src.get(f"{a}.q_b_proj.weight_scale_inv")[2:4])
    assert same(r1.get(f"{a}.o_proj.weight_scale_inv"), src.get(f"{a}.o_proj.weight_scale_inv")[:, 2:4])
    for whole in (f"{a}.kv_a_proj_with_mqa.weight", f"{a}.q_a_proj.weight_scale_inv", "model.layers.1.mlp.gate.e_score_correction_bias"):
        assert same(r1.get(whole), src.get(whole))
    assert "model.layers.1.mlp.experts.4.down_proj.weight_scale_inv" in r1 and "model.layers.1.mlp.experts.3.up_proj.weight" not in r1


def test_deepseek_mtp_layer_sharded_like_a_layer(sources, tmp_path):
    src = sources("deepseek-v3", "bf16")
    shard(src.root, tmp_path / "o", ep=2, tp=2)
    r0 = Checkpoint(tmp_path / "o" / "rank-00000-of-00002")
    m = "model.layers.2"
    assert r0.info(f"{m}.embed_tokens.weight").shape == (256, 256)  # vocab 512 split like embed_tokens
    assert r0.info(f"{m}.shared_head.head.weight").shape == (256, 256)
    assert r0.info(f"{m}.eh_proj.weight").shape == (256, 512)  # replicated
    assert f"{m}.mlp.experts.0.gate_proj.weight" in r0 and f"{m}.mlp.experts.4.gate_proj.weight" not in r0
    assert r0.config["quantkit_shard"]["experts"] == {"1": [0, 1, 2, 3], "2": [0, 1, 2, 3]}


def test_deterministic_whatever_the_workers(sources, tmp_path):
    src = sources("deepseek-v3", "mxfp8")
    a = shard(src.root, tmp_path / "a", ep=4, tp=2, max_shard_size=200_000)
    b = shard(src.root, tmp_path / "b", ep=4, tp=2, max_shard_size=200_000, workers=3)
    ma, mb = (json.loads((tmp_path / d / "quantkit.json").read_text()) for d in "ab")
    assert ma["files"] == mb["files"] and a["bytes_written"] == b["bytes_written"]
    assert {k: v for k, v in ma.items() if k != "created"} == {k: v for k, v in mb.items() if k != "created"}


def test_small_max_shard_size_splits_group_files(sources, tmp_path):
    src = sources("qwen3-moe", "source")
    shard(src.root, tmp_path / "o", ep=2, max_shard_size=100_000, verify_output=True)
    man = json.loads((tmp_path / "o" / "quantkit.json").read_text())
    assert len(man["groups"]["shared"]["files"]) > 1 and len(man["groups"]["rank00001"]["files"]) > 1


def test_dry_run_writes_nothing(sources, tmp_path):
    src = sources("gpt-oss", "source")
    rep = shard(src.root, tmp_path / "o", ep=4, tp=2, dry_run=True)
    assert rep["dry_run"] and not (tmp_path / "o").exists() and not list(tmp_path.iterdir())
    assert rep["bytes_written"] < rep["bytes_held"]


def test_dst_exists_needs_force(sources, tmp_path):
    src = sources("qwen3", "source")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep").write_text("x")
    with pytest.raises(ShardError, match="already exists: pass --force"):
        shard(src.root, tmp_path / "o", ep=2)
    assert (tmp_path / "o" / "keep").read_text() == "x"
    shard(src.root, tmp_path / "o", ep=2, force=True)
    assert not (tmp_path / "o" / "keep").exists() and (tmp_path / "o" / "quantkit.json").exists()


def test_dst_inside_src_refused(sources, tmp_path):
    src = sources("qwen3", "source")
    with pytest.raises(ShardError, match="must not be SRC"):
        shard(src.root, src.root / "sharded", ep=2)


def test_failure_leaves_nothing(sources, tmp_path, monkeypatch):
    from quantkit.shard import writer

    src = sources("deepseek-v3", "source")
    real, calls = writer.SliceReader.read, []

    def failing(self, piece):
        calls.append(piece.name)
        if len(calls) == 20:
            raise OSError("disk on fire")
        return real(self, piece)

    monkeypatch.setattr(writer.SliceReader, "read", failing)
    with pytest.raises(OSError, match="disk on fire"):
        shard(src.root, tmp_path / "o", ep=2)
    assert list(tmp_path.iterdir()) == []  # no DST, no hidden partial directory


def test_verify_failure_commits_nothing(sources, tmp_path, monkeypatch):
    from quantkit.shard import api

    def bad(dst, src):
        raise ShardError("verification failed")

    monkeypatch.setattr(api, "verify", bad)
    with pytest.raises(ShardError, match="verification failed"):
        shard(sources("qwen3", "source").root, tmp_path / "o", ep=2, verify_output=True)
    assert list(tmp_path.iterdir()) == []


def test_balanced_reports_load(sources, tmp_path):
    src = sources("qwen3-moe", "source")
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"layers": {"0": [50, 40, 1, 1, 1, 1, 1, 1], "1": [1, 1, 1, 1, 1, 1, 30, 30]}}))
    rep = shard(src.root, tmp_path / "o", ep=2, placement="balanced", expert_load=load, verify_output=True)
    # layer 0: 4 experts per rank, so the best is {50, 1, 1, 1} = 53 against a mean of 48; layer 1 is even
    assert rep["load"]["max_over_mean_worst_layer"] == pytest.approx(53 / 48)
    man = json.loads((tmp_path / "o" / "quantkit.json").read_text())
    assert man["experts"]["map"]["0"][:2] == [0, 1] and man["experts"]["map"]["1"][6:] == [0, 1]
    contiguous = shard(src.root, tmp_path / "c", ep=2, expert_load=load, dry_run=True)
    assert contiguous["load"]["max_over_mean_worst_layer"] == pytest.approx(92 / 48)


def test_verify_standalone(sources, tmp_path):
    src = sources("gpt-oss", "mxfp8")
    shard(src.root, tmp_path / "o", ep=2, tp=2)
    assert verify(tmp_path / "o", src)["ok"]
