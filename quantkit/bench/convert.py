"""Convert benchmark: a full-width synthetic GPT-OSS-20B (MXFP4 experts), cut in depth, to fp8-block and mxfp8.

    quantkit bench convert --work /tmp/bench [--layers 2] [--targets fp8-block mxfp8]
        [--device cpu|cuda] [--workers 1] [--fill fast|synth] [--append FILE] [--keep] [--preset tiny]

Source: names, shapes, dtypes and config from ``quantkit.synth.plan("gpt-oss", "gpt-oss-20b")``
(hidden 2880, 32 experts, vocab 201088; ``--layers`` cuts the depth; ``--preset tiny`` is the smoke run).  ``--fill fast`` fills it from
random pools (BF16 normal values, MXFP4 code bytes, E8M0 scale bytes 118..127: conversion speed does
not depend on the values) at disk speed; ``--fill synth`` runs ``quantkit.synth.synthesize``.

Per target: ``quantkit.converters.convert`` runs once; source GB/s = source tensor bytes / seconds,
output GB/s = output tensor bytes / seconds, CPU s = user + system seconds of every thread and worker process, peak RssAnon = the largest growth in any process that
converted a shard.  The I/O floor is measured in the same run: read every source shard with plain
``read()`` calls plus write as many bytes as the output has with plain ``write()`` calls (no fsync,
like the conversion); ``x floor`` = conversion seconds / floor seconds.  ``os.sync()`` runs before
each timing; the source was just written, so it is partly in the page cache for both.  The table goes to stdout and, with ``--append``, into a
markdown section with CPU, versions and the command; one record per target to WORK/results.jsonl (:mod:`.record`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from .record import Run

POOL = 32 << 20  # elements per random pool
BLOCK = 64 << 20  # bytes per read()/write() call of the I/O floor


def write_fast(preset: str, layers: int, dst: Path) -> int:
    """The synth layout filled from random pools, streamed through CheckpointWriter; returns bytes."""
    import torch

    from quantkit.writer import CheckpointWriter, plan_shards
    from quantkit.synth import plan

    synth = plan("gpt-oss", preset, layers)
    g = torch.Generator().manual_seed(0)
    pools = {torch.bfloat16: (torch.randn(POOL, generator=g) * 0.02).bfloat16(),
             "blocks": torch.randint(0, 256, (POOL,), dtype=torch.uint8, generator=g),
             "scales": torch.randint(118, 128, (POOL,), dtype=torch.uint8, generator=g)}

    def fill(spec):
        pool = pools["scales" if spec.name.endswith("_scales") else "blocks"] if spec.dtype == torch.uint8 else pools[torch.bfloat16]
        n = spec.nbytes // spec.dtype.itemsize
        return pool.repeat(-(-n // POOL))[:n].reshape(spec.shape)

    plans = plan_shards(synth.specs, 5 * 10**9)
    w = CheckpointWriter(dst)
    for p in plans:
        w.write(p, (fill(s) for s in p.specs))
    w.finish(plans, synth.config, {"command": "bench_convert fast fill", "options": {"layers": layers}})
    return sum(p.nbytes for p in plans)


def make_source(args: argparse.Namespace) -> Path:
    src = args.work / f"gpt-oss-{args.preset}-L{args.layers}"
    if src.exists():
        shutil.rmtree(src)
    t0 = time.perf_counter()
    if args.fill == "synth":
        from quantkit.synth import synthesize

        n = synthesize("gpt-oss", src, preset=args.preset, layers=args.layers)["bytes"]
    else:
        n = write_fast(args.preset, args.layers, src)
    print(f"source {n / 1e9:.2f} GB written in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return src


def io_floor(src: Path, out_bytes: int, scratch: Path) -> float:
    """Seconds to read every source shard and write ``out_bytes`` with plain file I/O."""
    t0 = time.perf_counter()
    for f in sorted(src.glob("*.safetensors")):
        with open(f, "rb", buffering=0) as fh:
            while fh.read(BLOCK):
                pass
    buf = os.urandom(1 << 20) * (BLOCK >> 20)
    with open(scratch, "wb", buffering=0) as fh:
        left = out_bytes
        while left > 0:
            left -= fh.write(memoryview(buf)[: min(BLOCK, left)])
    dt = time.perf_counter() - t0
    scratch.unlink()
    return dt


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads) and its finished worker processes."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_target(src: Path, to: str, args: argparse.Namespace) -> dict:
    from quantkit.converters import ConvertOptions, convert

    dst = args.work / f"gpt-oss-{args.preset}-L{args.layers}-{to}"
    opts = ConvertOptions(to=to, device=args.device, workers=args.workers, force=True)
    if args.warmup:  # compiles the kernels into Triton's on-disk cache, as any earlier run on the machine has
        convert(src, dst, opts)
        shutil.rmtree(dst)
    os.sync()  # start each timing without another run's dirty pages in flight
    cpu0 = cpu_seconds()
    rep = convert(src, dst, opts)
    cpu = cpu_seconds() - cpu0
    os.sync()
    fcpu0 = cpu_seconds()
    floor = io_floor(src, rep["output"]["bytes"], args.work / "floor.bin")
    floor_cpu = cpu_seconds() - fcpu0
    peaks = [s["rss_anon_peak"] - s["rss_anon_base"] for s in rep["memory"]["shards"]]
    paths = ", ".join(f"{p} x{r['tensors']}" for p, r in sorted(rep["paths"].items()))
    if not args.keep:
        shutil.rmtree(dst)
    return {"target": to, "source_gb": rep["source"]["bytes"] / 1e9, "output_gb": rep["output"]["bytes"] / 1e9,
            "seconds": rep["run"]["seconds"], "cpu_s": cpu, "src_gbps": rep["throughput"]["source_gbps"], "out_gbps": rep["throughput"]["output_gbps"],
            "peak_mib": max(peaks or [0]) / 2**20, "floor_s": floor, "floor_cpu_s": floor_cpu, "x_floor": rep["run"]["seconds"] / floor, "paths": paths,
            "backends": ", ".join(sorted(set(rep["run"]["backends"].values())))}


def table(rows: list[dict]) -> list[str]:
    out = ["| target | source GB | output GB | seconds | CPU s | source GB/s | output GB/s | peak RssAnon MiB | I/O floor s (CPU s) | x floor | paths | backend |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['target']} | {r['source_gb']:.2f} | {r['output_gb']:.2f} | {r['seconds']:.1f} | {r['cpu_s']:.1f} | {r['src_gbps']:.3f} | "
                   f"{r['out_gbps']:.3f} | {r['peak_mib']:.0f} | {r['floor_s']:.1f} ({r['floor_cpu_s']:.1f}) | {r['x_floor']:.1f} | {r['paths']} | {r['backends']} |")
    return out


def report(rows: list[dict], args: argparse.Namespace, run: Run) -> str:
    env = run.env
    omp = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} " if "OMP_NUM_THREADS" in os.environ else ""
    cmd = omp + run.command
    lines = [f"## convert ({time.strftime('%Y-%m-%d')})", "",
             f"`quantkit convert` of a synthetic GPT-OSS ({args.preset} widths) cut to {args.layers} layer(s) (MXFP4 experts; "
             f"source fill: {args.fill}), --device {args.device}, --workers {args.workers}. CPU: {env['cpu']}, torch threads "
             f"{env['torch_threads']}; device: {env['device']}; git {env['git']}; "
             f"{env['os']}; python {env['python']}, torch {env['torch']}, triton {env['triton']}, safetensors {env['safetensors']}, "
             f"quantkit {env['quantkit']}. Load average {args.load:.1f} when the conversions started. "
             + ("Each target was converted once untimed first (Triton's kernel cache warm, as after any earlier run on the machine; "
                "a cold first run adds the kernels' compile time)." if args.warmup else "No untimed warm-up run."), "",
             f"Command: `{cmd}`", "", *table(rows), "",
             "Source / output GB/s = tensor bytes read / written per second of the whole conversion (planning, "
             "numerics, per-tensor fidelity, sha256 of the output, writing, and the sha256-tree-64MiB digest of every source file that --resume checks). I/O floor = plain read() of the source shards plus "
             "write() of as many bytes as the output has, measured in the same run; x floor = conversion time / floor "
             "time; CPU s = user + system CPU seconds of the conversion, all threads and worker processes (on a shared machine the steadier figure). Peak RssAnon = largest growth of anonymous RSS in a process converting a shard (mmapped source "
             "pages excluded). Embeddings and lm_head (2 x 1.16 GB) are copies, so a cut depth flatters GB/s.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    from . import prog
    from .env import environment

    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="scratch directory for the source and outputs")
    p.add_argument("--layers", type=int, default=24, help="depth of the cut GPT-OSS-20B (24 = full)")
    p.add_argument("--preset", default="gpt-oss-20b", help="synth preset of the source's widths (tiny: a smoke run)")
    p.add_argument("--targets", nargs="+", default=["fp8-block", "mxfp8"], choices=["fp8-block", "mxfp8", "bf16"])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--fill", choices=["fast", "synth"], default="fast")
    p.add_argument("--append", type=Path, default=None, help="a markdown file to append the section to")
    p.add_argument("--keep", action="store_true", help="keep the source and outputs")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                   help="convert once untimed first (default: on with --device cuda, where a cold run also compiles the Triton kernels)")
    args = p.parse_args(argv)
    args.warmup = args.device == "cuda" if args.warmup is None else args.warmup
    args.work.mkdir(parents=True, exist_ok=True)
    run = Run.start(__name__, argv, environment(args.device))
    src = make_source(args)
    args.load = os.getloadavg()[0]
    rows = []
    for to in args.targets:
        rows.append(run_target(src, to, args))
        run.write(args.work / "results.jsonl", rows[-1], ("target",))
        print(f"[{to}] {rows[-1]}", file=sys.stderr, flush=True)
    if not args.keep:
        shutil.rmtree(src)
    text = report(rows, args, run)
    if args.append:
        with open(args.append, "a") as f:
            f.write(("\n" if args.append.exists() and args.append.stat().st_size else "") + text)
    print(text)

