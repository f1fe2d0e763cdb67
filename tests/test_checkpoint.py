"""Checkpoint reader/writer: validation errors name the file, writes are streaming and atomic."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.checkpoint import INDEX, Checkpoint, CheckpointError, parse_size, read_header
from quantkit.writer import CheckpointWriter, TensorSpec, plan_shards


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g).bfloat16(),
        "model.layers.0.w.weight": torch.randn(8, 8, generator=g).to(torch.float8_e4m3fn),
        "model.layers.0.w.weight_scale_inv": torch.rand(1, 1, generator=g),
        "model.layers.0.s": torch.arange(12, dtype=torch.uint8),
    }


def _sharded(tmp: Path) -> Path:
    d = tmp / "ck"
    d.mkdir()
    ts = _tensors()
    names = list(ts)
    save_file({k: ts[k] for k in names[:2]}, str(d / "a.safetensors"))
    save_file({k: ts[k] for k in names[2:]}, str(d / "b.safetensors"))
    wmap = {k: ("a" if i < 2 else "b") + ".safetensors" for i, k in enumerate(names)}
    (d / INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wmap}))
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (d / "tokenizer.json").write_text("{}")
    return d


def test_reads_sharded_lazily(tmp_path: Path) -> None:
    ck = Checkpoint(_sharded(tmp_path))
    ts = _tensors()
    assert set(ck.names()) == set(ts)
    for k, v in ts.items():
        assert torch.equal(ck.get(k).view(torch.uint8), v.view(torch.uint8)), k
    assert ck.info("model.layers.0.s").file == "b.safetensors"
    assert [p.name for p in ck.side_files()] == ["tokenizer.json"]


def test_fingerprint_tracks_headers(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    f1 = Checkpoint(d).fingerprint()
    save_file({"x": torch.zeros(3)}, str(d / "b.safetensors"))
    idx = json.loads((d / INDEX).read_text())
    idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if v == "a.safetensors"} | {"x": "b.safetensors"}
    (d / INDEX).write_text(json.dumps(idx))
    assert Checkpoint(d).fingerprint() != f1


def test_truncated_file_is_named(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    p = d / "b.safetensors"
    p.write_bytes(p.read_bytes()[:-5])
    with pytest.raises(CheckpointError, match=r"b\.safetensors.*truncated"):
        Checkpoint(d)


def test_tiny_file_without_header(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="x.safetensors: truncated"):
        read_header(p)


def test_header_length_beyond_file(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(CheckpointError, match="header length"):
        read_header(p)


def test_header_that_lies_about_size(tmp_path: Path) -> None:
    hdr = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + bytes(8))
    with pytest.raises(CheckpointError, match=r"'t' F32\[4\] needs 16 bytes, header gives 8"):
        read_header(p)


def test_header_with_gap(tmp_path: Path) -> None:
    hdr = json.dumps({"t": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}).encode()
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + bytes(8))
    with pytest.raises(CheckpointError, match="do not tile"):
        read_header(p)


def test_header_not_json(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_header(p)


def test_index_points_to_missing_file(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    (d / "b.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing file b.safetensors"):
        Checkpoint(d)


def test_index_points_to_missing_tensor(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    idx = json.loads((d / INDEX).read_text())
    idx["weight_map"]["model.layers.0.s"] = "a.safetensors"
    (d / INDEX).write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match=r"'model.layers.0.s' is mapped to a.safetensors, which does not hold it"):
        Checkpoint(d)


def test_file_with_unlisted_tensor(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    idx = json.loads((d / INDEX).read_text())
    del idx["weight_map"]["model.layers.0.s"]
    (d / INDEX).write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match="b.safetensors: holds tensors the index does not list: model.layers.0.s"):
        Checkpoint(d)


def test_several_files_without_index(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    (d / INDEX).unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors.index.json"):
        Checkpoint(d)


def test_original_layout_is_found(tmp_path: Path) -> None:
    (tmp_path / "original").mkdir()
    save_file({"embedding.weight": torch.ones(2, 2)}, str(tmp_path / "original" / "model.safetensors"))
    ck = Checkpoint(tmp_path)
    assert ck.layout == "original" and ck.names() == ["embedding.weight"]


def test_parse_size() -> None:
    assert parse_size("5GB") == 5_000_000_000
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("1234") == 1234
    with pytest.raises(ValueError, match="cannot read size"):
        parse_size("lots")


def _write(dst: Path, ts: dict[str, torch.Tensor], cap: int, **kw) -> list:
    plans = plan_shards([TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in ts.items()], cap)
    w = CheckpointWriter(dst, **kw)
    for p in plans:
        w.write(p, iter([ts[s.name] for s in p.specs]))
    w.finish(plans, {"architectures": ["X"]}, {"command": "test"})
    return plans


def test_writer_round_trip_and_index(tmp_path: Path) -> None:
    ts = _tensors()
    plans = _write(tmp_path / "out", ts, cap=300)
    assert len(plans) > 1 and all(p.nbytes <= 300 or len(p.specs) == 1 for p in plans)
    out = tmp_path / "out"
    idx = json.loads((out / INDEX).read_text())
    assert idx["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in ts.values())
    for p in plans:  # files load with the reference safetensors reader
        loaded = load_file(str(out / p.file))
        for s in p.specs:
            assert torch.equal(loaded[s.name].view(torch.uint8), ts[s.name].view(torch.uint8))
    man = json.loads((out / "quantkit.json").read_text())
    assert set(man["files"]) >= {p.file for p in plans} | {INDEX, "config.json"}
    assert not list(tmp_path.glob(".out.quantkit-partial"))


def test_writer_refuses_existing_dst(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists: pass --force"):
        CheckpointWriter(tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_writer_force_replaces(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("x")
    _write(tmp_path / "out", _tensors(), cap=10**6, force=True)
    assert not (tmp_path / "out" / "old.txt").exists() and (tmp_path / "out" / INDEX).exists()


def test_writer_failure_leaves_no_dst(tmp_path: Path) -> None:
    ts = _tensors()
    plans = plan_shards([TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in ts.items()], 10**6)
    w = CheckpointWriter(tmp_path / "out")
    bad = iter([torch.zeros(3)] * 4)
    with pytest.raises(CheckpointError, match="planned"):
        w.write(plans[0], bad)
    assert not (tmp_path / "out").exists()
    w.abort()
    assert not any(tmp_path.iterdir())


def test_resume_keeps_verified_shards(tmp_path: Path) -> None:
    ts = _tensors()
    specs = [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in ts.items()]
    plans = plan_shards(specs, 300)
    w = CheckpointWriter(tmp_path / "out", job={"a": 1})
    w.write(plans[0], iter([ts[s.name] for s in plans[0].specs]))
    w.close()  # the interrupted run's lock goes with its process
    # a second run with --resume trusts shard 1 (checksum matches) and must not rewrite it
    w2 = CheckpointWriter(tmp_path / "out", resume=True, job={"a": 1})
    assert w2.is_done(plans[0].file) and not w2.is_done(plans[1].file)
    # a corrupted shard is not trusted
    p = w2.shard_path(plans[0].file)
    p.write_bytes(p.read_bytes()[:-1] + b"\x00")
    w2.close()
    w3 = CheckpointWriter(tmp_path / "out", resume=True, job={"a": 1})
    assert not w3.is_done(plans[0].file)
    w3.close()
    with pytest.raises(CheckpointError, match="other inputs or options"):
        CheckpointWriter(tmp_path / "out", resume=True, job={"a": 2})
