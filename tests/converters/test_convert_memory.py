"""Streaming: peak anonymous RSS per worker (RssAnon, so the mmapped source pages — page cache —
do not count) stays under a bound set by the largest tensor, not by the model.  Measured in a
fresh subprocess, after a warm-up conversion, so the figures are this conversion's alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .support import header, write_qwen3

PROBE = """
import json, sys
from quantkit.converters import ConvertOptions, convert
from quantkit.converters.memory import RssSampler, rss_anon
warm, src, dst, workers, chunk, shard = sys.argv[1:7]
convert(warm, dst + "-warm", ConvertOptions(to="fp8-block"))
base = rss_anon()
with RssSampler() as s:
    opts = ConvertOptions(to="fp8-block", workers=int(workers), chunk_elements=int(chunk), max_shard_size=int(shard))
    rep = convert(src, dst, opts)
print(json.dumps({"base": base, "peak": s.peak, "shards": rep["memory"]["shards"], "bytes": rep["source"]["bytes"]}))
"""
BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1}
# bound = FACTOR x the largest tensor: its output and the one before it, f32 temporaries of a chunk
# (1/16 of it, ~40 B/element), and what glibc's heap keeps of freed chunks
FACTOR = 10


def probe(warm: Path, src: Path, dst: Path, workers: int, shard: int = 5_000_000_000) -> tuple[dict, int]:
    largest = max(BYTES[d] * _numel(s) for d, s in header(src).values())
    chunk = largest // BYTES["BF16"] // 16
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", PROBE, str(warm), str(src), str(dst), str(workers), str(chunk), str(shard)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), largest


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def check(rep: dict, largest: int, workers: int) -> None:
    bound = FACTOR * largest
    assert rep["bytes"] > 4 * bound, "the model must be much larger than the bound for the test to mean anything"
    if workers == 1:  # the conversion ran in the probe process itself
        growth = rep["peak"] - rep["base"]
        assert growth < bound, f"peak RssAnon grew {growth / 2**20:.1f} MiB; bound {bound / 2**20:.1f} MiB (largest tensor {largest / 2**20:.1f} MiB)"
    for s in rep["shards"]:  # per worker process, from its start of work on the shard
        growth = s["rss_anon_peak"] - s["rss_anon_base"]
        assert growth < bound, f"{s['file']}: peak RssAnon grew {growth / 2**20:.1f} MiB; bound {bound / 2**20:.1f} MiB"


def test_memory_is_bounded_by_the_largest_tensor_small(synth, tmp_path) -> None:
    src = tmp_path / "src"
    write_qwen3(src, hidden=512, inter=2048, layers=12, vocab=2048, shard_bytes=24 << 20)
    rep, largest = probe(synth("qwen3"), src, tmp_path / "o", workers=1)
    check(rep, largest, 1)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_memory_is_bounded_by_the_largest_tensor_1gb(synth, tmp_path, workers) -> None:
    src = tmp_path / "src"
    total = write_qwen3(src, hidden=1024, inter=4096, layers=32, vocab=4096)
    assert total >= 1_000_000_000
    rep, largest = probe(synth("qwen3"), src, tmp_path / "o", workers=workers, shard=128_000_000)
    assert len(rep["shards"]) > 2
    check(rep, largest, workers)
