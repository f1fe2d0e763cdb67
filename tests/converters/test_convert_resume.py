"""Determinism (workers, shard splits), atomic commits and --resume after a killed run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from quantkit.checkpoint import CheckpointError
from quantkit.writer import CheckpointWriter
from quantkit.converters import ConvertOptions, make_plan
from quantkit.converters.engine import execute
from quantkit.converters.provenance import FILE_HASH, SourceHashes

from .support import run, shard_bytes, tensors

STOCHASTIC = dict(to="fp8-block", rounding="stochastic", seed=1)


def same_checkpoint(a: Path, b: Path) -> None:
    assert shard_bytes(a) == shard_bytes(b)
    for name in ("model.safetensors.index.json", "config.json", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ma, mb = (json.loads((p / "quantkit.json").read_text()) for p in (a, b))
    ma.pop("created"), mb.pop("created")
    assert ma == mb


def test_bytes_do_not_depend_on_workers(synth, tmp_path) -> None:
    src = synth("qwen3-moe")
    one = run(src, tmp_path / "w1", workers=1, max_shard_size=1_500_000, **STOCHASTIC)
    two = run(src, tmp_path / "w2", workers=2, max_shard_size=1_500_000, **STOCHASTIC)
    assert one["output"]["shards"] == two["output"]["shards"] > 2
    same_checkpoint(tmp_path / "w1", tmp_path / "w2")
    assert len(two["memory"]["shards"]) == two["output"]["shards"]


def test_weight_and_scale_in_different_shards(synth, tmp_path) -> None:
    src = synth("gpt-oss", "tiny-ragged")
    run(src, tmp_path / "one", **STOCHASTIC)
    rep = run(src, tmp_path / "many", max_shard_size=60_000, **STOCHASTIC)
    idx = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())["weight_map"]
    split = [n for n in idx if n + "_scale_inv" in idx and idx[n] != idx[n + "_scale_inv"]]
    assert split, "the test needs a weight whose scale lands in the next shard"
    a, b = tensors(tmp_path / "one"), tensors(tmp_path / "many")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
    one = json.loads((tmp_path / "one" / "quantkit.json").read_text())["tensors"]
    assert json.loads((tmp_path / "many" / "quantkit.json").read_text())["tensors"] == one
    assert rep["output"]["shards"] > 5


def start(src: Path, dst: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "quantkit.cli", "convert", str(src), str(dst), "--to", "fp8-block",
            "--rounding", "stochastic", "--seed", "1", "--max-shard-size", "3MB"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def kill_after_first_shard(proc: subprocess.Popen, partial: Path, timeout: float = 120) -> int:
    """SIGKILL ``proc`` once progress.json records a shard; return how many it had recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        prog = partial / "progress.json"
        if prog.exists():
            try:
                done = len(json.loads(prog.read_text())["files"])
            except (json.JSONDecodeError, KeyError):
                done = 0  # caught mid-replace
            if done:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return done
        if proc.poll() is not None:
            pytest.fail(f"the conversion ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail("no shard was recorded in time")


def test_killed_run_leaves_no_dst_and_resume_gives_identical_bytes(synth, tmp_path) -> None:
    src = synth("qwen3", layers=24)
    dst = tmp_path / "o"
    partial = tmp_path / ".o.quantkit-partial"
    done = kill_after_first_shard(start(src, dst), partial)
    assert not dst.exists(), "a killed run left a DST"
    plan_shards = run(src, tmp_path / "dry", dry_run=True, max_shard_size=3_000_000, **STOCHASTIC)["output"]["shards"]
    assert 1 <= done < plan_shards
    with pytest.raises(CheckpointError, match="used other inputs or options"):
        run(src, dst, resume=True, to="fp8-block", rounding="stochastic", seed=2, max_shard_size=3_000_000)
    assert partial.is_dir(), "a refused resume must keep the partial run"
    first = sorted(partial.glob("model-*.safetensors"))[0]
    rep = run(src, dst, resume=True, max_shard_size=3_000_000, **STOCHASTIC)
    assert rep["run"]["shards_resumed"] >= 1 and not partial.exists()
    run(src, tmp_path / "ref", max_shard_size=3_000_000, **STOCHASTIC)
    same_checkpoint(dst, tmp_path / "ref")
    assert first.name in shard_bytes(dst)


def test_resume_rewrites_a_corrupted_shard(synth, tmp_path) -> None:
    src = synth("qwen3", layers=4)
    opts = dict(max_shard_size=1_000_000, **STOCHASTIC)
    run(src, tmp_path / "ref", **opts)
    plan = make_plan(str(src), ConvertOptions(**opts))
    writer = CheckpointWriter(tmp_path / "o", job=plan.job(), sources=SourceHashes(plan), file_hash=FILE_HASH)
    execute(plan, writer, lambda n: None)  # every shard written, then "killed" before the commit
    writer.close()  # its lock goes with the killed process
    assert not (tmp_path / "o").exists()
    first = writer.tmp / plan.shards[0].file
    raw = bytearray(first.read_bytes())
    raw[-1] ^= 0xFF
    first.write_bytes(bytes(raw))
    rep = run(src, tmp_path / "o", resume=True, **opts)
    assert rep["run"]["shards_written"] == 1 and rep["run"]["shards_resumed"] == len(plan.shards) - 1
    same_checkpoint(tmp_path / "o", tmp_path / "ref")


def test_force_replaces_only_when_complete(synth, tmp_path) -> None:
    dst = tmp_path / "o"
    run(synth("qwen3"), dst, to="bf16")
    before = shard_bytes(dst)
    run(synth("qwen3"), dst, to="fp8-block", force=True)
    assert shard_bytes(dst) != before
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["quant_method"] == "fp8"
    assert not list(tmp_path.glob(".o.quantkit-*"))
