"""``verify`` catches every way a sharded output can be wrong (one test per rule it enforces)."""

from __future__ import annotations

import json
import shutil

import pytest

from quantkit.checkpoint import Checkpoint
from quantkit.writer import sha256_file
from quantkit.shard import ShardError, shard, verify

from .tiny import build as build_tiny


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("v")
    ds = build_tiny("deepseek-v3", "source", root / "ds")
    shard(ds, root / "ds-out", ep=2, tp=2)
    gpt = build_tiny("gpt-oss", "source", root / "gpt")
    shard(gpt, root / "gpt-out", ep=2)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def out(made, tmp_path):
    """A private copy (links broken, so tampering with one rank's file does not touch another's)."""

    def get(name: str):
        dst = tmp_path / name
        shutil.copytree(made / f"{name}-out", dst)
        return dst, Checkpoint(made / name)

    return get


def _rehash(dst, rel: str) -> None:
    man = json.loads((dst / "quantkit.json").read_text())
    man["files"][rel] = sha256_file(dst / rel)
    (dst / "quantkit.json").write_text(json.dumps(man))


def _edit_json(dst, rel: str, fn) -> None:
    p = dst / rel
    data = json.loads(p.read_text())
    fn(data)
    p.write_text(json.dumps(data))
    if rel != "quantkit.json":
        _rehash(dst, rel)


def _flip_last_byte(path) -> None:
    b = bytearray(path.read_bytes())
    b[-1] ^= 0x01
    path.write_bytes(bytes(b))


def test_clean_output_passes(out):
    dst, src = out("ds")
    assert verify(dst, src)["ok"]


def test_corrupt_file_fails_its_sha(out):
    dst, src = out("ds")
    f = "rank-00001-of-00002/model-rank00001-00001-of-00001.safetensors"
    _flip_last_byte(dst / f)
    with pytest.raises(ShardError, match="sha256 differs"):
        verify(dst, src)


def test_changed_bytes_fail_reassembly(out):
    dst, src = out("ds")
    f = "rank-00001-of-00002/model-rank00001-00001-of-00001.safetensors"
    _flip_last_byte(dst / f)
    _rehash(dst, f)
    with pytest.raises(ShardError, match="differs from the source|differ from the source"):
        verify(dst, src)


def test_extra_file_is_reported(out):
    dst, src = out("ds")
    (dst / "rank-00000-of-00002" / "stray.bin").write_bytes(b"x")
    with pytest.raises(ShardError, match="extra \\['rank-00000-of-00002/stray.bin'\\]"):
        verify(dst, src)


def test_expert_on_the_wrong_rank(out):
    dst, src = out("ds")
    _edit_json(dst, "quantkit.json", lambda m: m["experts"]["map"]["1"].__setitem__(0, 1))
    with pytest.raises(ShardError, match=r"model.layers.1.mlp.experts.0.*held by ranks \[0\], needed by exactly \[1\]"):
        verify(dst, src)


def test_tp_slice_description_that_does_not_tile(out):
    dst, src = out("ds")
    name = "model.layers.0.self_attn.q_b_proj.weight"

    def shift(c):
        c["quantkit_shard"]["splits"][name].update(start=0, stop=256)  # rank 1 claims rank 0's rows

    _edit_json(dst, "rank-00001-of-00002/config.json", shift)
    with pytest.raises(ShardError, match="overlaps another rank's piece|uncovered"):
        verify(dst, src)


def test_scale_slice_must_follow_its_weight(out):
    dst, src = out("ds")
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    _edit_json(dst, "rank-00001-of-00002/config.json", lambda c: c["quantkit_shard"]["splits"].pop(name))
    with pytest.raises(ShardError, match="o_proj.weight_scale_inv.*(differs from the source|does not follow)"):
        verify(dst, src)


def test_coordinates_follow_the_rank_formula(out):
    dst, src = out("ds")
    _edit_json(dst, "rank-00001-of-00002/config.json", lambda c: c["quantkit_shard"].update(tp_rank=0))
    with pytest.raises(ShardError, match="rank = dp_rank x tp \\+ tp_rank"):
        verify(dst, src)


def test_fused_experts_must_match_the_map(out):
    dst, src = out("gpt")
    name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    _edit_json(dst, "rank-00001-of-00002/config.json", lambda c: c["quantkit_shard"]["splits"][name].update(experts=[0, 1, 2, 3]))
    with pytest.raises(ShardError, match="holds experts \\[0, 1, 2, 3\\], the map gives this rank \\[4, 5, 6, 7\\]"):
        verify(dst, src)


def test_other_source_is_refused(out, made):
    dst, _ = out("ds")
    with pytest.raises(ShardError, match="made from another source"):
        verify(dst, Checkpoint(made / "gpt"))


def test_missing_tensor(out):
    """Rank 0 loses the (replicated) router bias: its file and index are rewritten without it."""
    from safetensors.torch import load_file, save_file

    dst, src = out("gpt")
    name, rd = "model.layers.0.mlp.router.bias", "rank-00000-of-00002"
    idx = json.loads((dst / rd / "model.safetensors.index.json").read_text())
    fname = idx["weight_map"].pop(name)
    tensors = load_file(dst / rd / fname)
    del tensors[name]
    save_file(tensors, dst / rd / fname, metadata={"format": "pt"})
    (dst / rd / "model.safetensors.index.json").write_text(json.dumps(idx))
    _rehash(dst, f"{rd}/{fname}")
    _rehash(dst, f"{rd}/model.safetensors.index.json")
    with pytest.raises(ShardError, match=r"model.layers.0.mlp.router.bias: held by ranks \[1\], needed by exactly \[0, 1\]"):
        verify(dst, src)
