"""Every benchmark with a CPU path runs a tiny case end to end (``--device cpu``: Triton's interpreter on tiny
shapes; the CPU benchmarks on tiny presets) and writes valid records.  The whole file takes about a minute on
the 2-core CI machine; profile-moe (CUDA only) is the one benchmark not run here, sharded-gap and load-serve have
tests of their own (tests/bench/test_sharded_gap.py, tests/serve/test_load.py), roofline in test_roofline.py."""

from __future__ import annotations

import json
import socket

import pytest

from .benchrun import bench, records

KERNEL_RUNS = {  # name -> arguments after --device cpu --out OUT: the smallest case that runs each code path
    "kernels": ["--ms", "1"],  # main pass on three scaled-down shapes, then the quick sweep
    "moe": ["--models", "gpt-oss-120b", "--formats", "fp8-block", "--tokens", "1", "--no-sweep"],
    "attention": ["--parts", "decode", "--no-sweep"],
    "mla": ["--no-sweep"],
    "formats": ["--ops", "act_quant_mxfp8"],
    "fused-quant": ["--cases", "rmsnorm-mxfp8", "--m", "1"],
    "sweep-decode": [],
    "sweep-moe-decode": ["--tokens", "1"],
    "sweep-moe-prefill": ["--models", "gpt-oss-120b", "--tokens", "1"],
}


@pytest.mark.parametrize("name", KERNEL_RUNS)
def test_kernel_benchmark_smoke_run(name, tmp_path):
    bench(name, "--device", "cpu", "--out", str(tmp_path), *KERNEL_RUNS[name])
    rows = records(tmp_path / "results.jsonl", name)
    assert all(r["env"]["device"] == "cpu" for r in rows)
    checks = [r["metrics"].get("check") or r["metrics"].get("exact") for r in rows]
    assert not [c for c in checks if c and c.startswith(("FAIL", "error", "NO"))], checks


def test_convert_smoke_run(tmp_path):
    work, doc = tmp_path / "work", tmp_path / "perf.md"
    out = bench("convert", "--work", str(work), "--preset", "tiny", "--layers", "1", "--targets", "fp8-block", "--append", str(doc))
    (row,) = records(work / "results.jsonl", "convert")
    assert row["params"] == {"target": "fp8-block"} and row["metrics"]["output_gb"] > 0
    assert "| fp8-block |" in out
    assert [p.name for p in work.iterdir()] == ["results.jsonl"]  # source and output removed without --keep
    assert doc.read_text().startswith("## convert (") and f"Command: `{row['command']}`" in doc.read_text()  # --append: the report


def test_shard_smoke_run(tmp_path):
    work, doc = tmp_path / "work", tmp_path / "perf.md"
    bench("shard", "--work", str(work), "--preset", "tiny", "--models", "gpt-oss-120b", "--ep", "2", "--append", str(doc))
    (row,) = records(work / "results.jsonl", "shard")
    assert row["params"] == {"model": "gpt-oss-120b"} and row["metrics"]["files"] > 0
    assert f"Command: `{row['command']}`" in doc.read_text() and "| gpt-oss-120b | 2 (2) |" in doc.read_text()


def test_hash_smoke_run(tmp_path):
    bench("hash", "--file", str(tmp_path / "h.bin"), "--gb", "0.001", "--threads", "1", "--repeat", "1", "--out", str(tmp_path))
    rows = records(tmp_path / "results.jsonl", "hash")
    assert [r["params"] for r in rows] == [{"hash": "sha256", "threads": 1}, {"hash": "sha256-tree-64MiB", "threads": 1}]


def test_host_overhead_smoke_run(tmp_path):
    bench("host-overhead", "--concurrency", "1,2", "--prompt-len", "8", "--gen", "3", "--repeat", "1", "--max-num-seqs", "2",
          "--out", str(tmp_path))  # fmt: skip
    rows = records(tmp_path / "results.jsonl", "host-overhead")
    assert [r["params"]["concurrency"] for r in rows] == [1, 2] and all(r["metrics"]["host_us_per_step"] > 0 for r in rows)


def test_ep_traffic_smoke_run(tmp_path):
    bench("ep-traffic", "--decode-tokens", "4", "--prefill-tokens", "32", "--hidden", "256", "--out", str(tmp_path))
    rows = records(tmp_path / "results.jsonl", "ep-traffic")
    assert [(r["params"]["step"], r["params"]["ep"]) for r in rows] == [(s, w) for s in ("decode", "prefill") for w in (2, 4, 8, 16)]


def test_serve_smoke_run(tmp_path):
    out = bench("serve", "--out", str(tmp_path), "--device", "cpu", "--family", "qwen3-moe", "--concurrency", "1,3",
                "--prompt-len", "8", "--gen", "3")  # fmt: skip
    rows = records(tmp_path / "results.jsonl", "serve")
    assert [r["params"]["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        m = r["metrics"]
        assert m["engine_tok_s"] > 0 and m["http_tok_s"] > 0 and m["raw_step_ms"] > 0 and m["hbm_floor_ms"] > 0
    assert "| C | engine tok/s | http tok/s |" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_ceiling_smoke_run(tmp_path):
    """The stub server and the HTTP load generator each in a process of their own."""
    out = bench("http-ceiling", "--out", str(tmp_path), "--concurrency", "1", "--gen", "4", "--prompt-len", "8", "--step-ms", "1",
                "--port", str(_free_port()))  # fmt: skip
    rows = records(tmp_path / "results.jsonl", "http")  # the load generator's records
    assert [(r["params"]["concurrency"], r["params"]["mode"]) for r in rows] == [(1, "stream"), (1, "whole")]
    assert "| 1 | stream |" in out


def test_http_reports_each_level_and_mode(tmp_path):
    """The HTTP benchmark against a tiny server in this process: a row per concurrency and mode whose token counts
    it checked, stream latencies, the plot; then the engine figures of a serve run read back from its records."""
    from quantkit.serve.launch import build
    from quantkit.synth import synthesize

    synthesize("qwen3", tmp_path / "ckpt", preset="tiny")
    s = build(str(tmp_path / "ckpt"), port=0, dtype="float32", act_quant=False, max_model_len=128, kv_cache_gib=0.01)
    s.start_background()
    engine = tmp_path / "engine.jsonl"
    engine.write_text("".join(json.dumps({"concurrency": c, "prompt_len": 8, "gen": 4, "lookahead": True, "engine_tok_s": 10.0 * c}) + "\n"
                              for c in (1, 3)))  # flat rows, as serve wrote them before its records: read as well
    try:
        bench("http", "--url", s.url, "--out", str(tmp_path / "out"), "--concurrency", "1,3", "--prompt-len", "8", "--gen", "4",
              "--rounds", "1", "--vocab", "500", "--engine-results", str(engine))  # fmt: skip
    finally:
        s.close()
    rows = [r["params"] | r["metrics"] for r in records(tmp_path / "out" / "results.jsonl", "http")]
    assert [(x["concurrency"], x["mode"]) for x in rows] == [(1, "stream"), (1, "whole"), (3, "stream"), (3, "whole")]
    assert all(x["http_tok_s"] > 0 for x in rows) and all(0 < x["ttft_p50_ms"] <= x["ttft_p99_ms"] for x in rows[::2])
    assert [x["engine_tok_s"] for x in rows] == [10.0, 10.0, 30.0, 30.0]
    assert (tmp_path / "out" / "http.png").stat().st_size > 0
