"""Shard benchmark: full-width DeepSeek-V3- and GPT-OSS-120B-shaped checkpoints (cut in depth), sharded --ep 16.

    quantkit bench shard --work /tmp/bench [--models deepseek-v3 gpt-oss-120b]
        [--layers deepseek-v3=3 gpt-oss-120b=2] [--ep 16] [--tp 1] [--workers 1] [--fill fast|synth] [--verify]
        [--append FILE] [--keep] [--preset tiny]

Sources: names, shapes, dtypes and config from ``quantkit.synth.plan`` (the released models'
widths; ``--layers`` cuts the depth; ``--preset tiny`` takes every model's tiny preset: the smoke run).  ``--fill fast`` fills them with bytes tiled from a 64 MiB
random pool (sharding copies bytes, so values do not matter and the source is written at disk
speed); ``--fill synth`` runs ``quantkit.synth.synthesize`` (real weights, ~35 MB/s on a small CPU).
Each model is sharded with ``quantkit.shard.shard`` in this process while a thread samples peak
anonymous RSS; GB/s is bytes written (each shared group file once) per second.  The table goes
to stdout and, with ``--append``, into a markdown section with CPU, versions and the command; one record
per model to WORK/results.jsonl (:mod:`.record`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from .record import Run

MODELS = {"deepseek-v3": ("deepseek-v3", "deepseek-v3"), "gpt-oss-120b": ("gpt-oss", "gpt-oss-120b")}  # name -> (family, preset)
DEFAULT_LAYERS = {"deepseek-v3": 3, "gpt-oss-120b": 2}
POOL = 64 << 20


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakRss:
    """Samples RssAnon every 5 ms in a thread; ``grew`` = peak minus the value at start."""

    def __init__(self) -> None:
        self.base, self.peak, self.stop = rss_anon(), 0, threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.005)

    def __enter__(self) -> PeakRss:
        self.t0 = time.perf_counter()
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join()

    @property
    def grew(self) -> int:
        return max(self.peak - self.base, 0)


def write_fast(family: str, preset: str, layers: int, dst: Path) -> dict:
    """The synth layout filled with tiled random bytes (streamed through CheckpointWriter)."""
    import torch

    from quantkit.writer import CheckpointWriter, plan_shards
    from quantkit.synth import plan

    synth = plan(family, preset, layers)
    pool = torch.randint(0, 256, (POOL,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def fill(spec):
        n = spec.nbytes
        raw = pool.repeat(-(-n // POOL))[:n] if n > POOL else pool[:n]
        return raw.view(spec.dtype).reshape(spec.shape)

    t0 = time.perf_counter()
    plans = plan_shards(synth.specs, 5 * 10**9)
    w = CheckpointWriter(dst)
    for p in plans:
        w.write(p, (fill(s) for s in p.specs))
    w.finish(plans, synth.config, {"command": "bench_shard fast fill", "options": {"family": family, "preset": preset, "layers": layers}})
    return {"bytes": sum(p.nbytes for p in plans), "seconds": time.perf_counter() - t0}


def make_source(name: str, layers: int, fill: str, work: Path, preset: str | None = None) -> tuple[Path, dict]:
    family, preset = MODELS[name][0], preset or MODELS[name][1]
    src = work / f"{name}-L{layers}"
    if src.exists():
        shutil.rmtree(src)
    if fill == "synth":
        from quantkit.synth import synthesize

        r = synthesize(family, src, preset=preset, layers=layers)
        return src, {"bytes": r["bytes"], "seconds": r["seconds"]}
    return src, write_fast(family, preset, layers, src)


def copy_baseline(src: Path, work: Path) -> float:
    """GB/s of copying the source's safetensors files (shutil.copyfile: kernel copy, no hashing), same disk, same run."""
    dst = work / "copy-baseline"
    dst.mkdir()
    files = sorted(src.glob("*.safetensors"))
    t0 = time.perf_counter()
    for f in files:
        shutil.copyfile(f, dst / f.name)
    os.sync()
    dt = time.perf_counter() - t0
    shutil.rmtree(dst)
    return sum(f.stat().st_size for f in files) / dt / 1e9


def run_one(name: str, layers: int, args: argparse.Namespace) -> dict:
    from quantkit.checkpoint import Checkpoint
    from quantkit.progress import style
    from quantkit.shard import shard, verify

    src, made = make_source(name, layers, args.fill, args.work, args.preset)
    print(f"[{name}] source {made['bytes'] / 1e9:.2f} GB written in {made['seconds']:.1f} s", file=sys.stderr, flush=True)
    cp_gbs = copy_baseline(src, args.work)
    dst = args.work / f"{name}-L{layers}-ep{args.ep}-tp{args.tp}"
    load = os.getloadavg()[0]
    with PeakRss() as mem:
        rep = shard(src, dst, ep=args.ep, tp=args.tp, force=True, workers=args.workers, progress=style())
        os.sync()  # count the write-back, as the copy baseline does
    seconds = time.perf_counter() - mem.t0
    row = {"model": name, "layers": layers, "moe_layers": rep["moe_layers"], "load_avg": load, "cp_gb_s": cp_gbs, "source_gb": rep["source_bytes"] / 1e9, "tensors": len(Checkpoint(src).names()),
           "written_gb": rep["bytes_written"] / 1e9, "held_gb": rep["bytes_held"] / 1e9, "max_rank_gb": rep["max_rank_bytes"] / 1e9,
           "seconds": seconds, "gb_s": rep["bytes_written"] / seconds / 1e9, "peak_anon_mib": mem.grew / 2**20,
           "files": sum(1 for _ in dst.rglob("*.safetensors")), "inodes": len({os.stat(p).st_ino for p in dst.rglob("*.safetensors")})}
    if args.verify:
        t0 = time.perf_counter()
        verify(dst, Checkpoint(src))
        row["verify_s"] = time.perf_counter() - t0
    print(f"[{name}] {json.dumps(row)}", file=sys.stderr, flush=True)
    if not args.keep:
        shutil.rmtree(dst)
        shutil.rmtree(src)
    return row


def table(rows: list[dict], ep: int) -> list[str]:
    v = any("verify_s" in r for r in rows)
    out = [f"| model | layers (MoE) | source GB | tensors | written once GB | held by {ep} ranks GB | largest rank GB | files / inodes "
           "| seconds | GB/s written | copy baseline GB/s | shard / copy | peak anon RSS MiB | load avg |" + (" verify s |" if v else ""),
           "|---" * (14 + v) + "|"]
    for r in rows:
        line = (f"| {r['model']} | {r['layers']} ({r['moe_layers']}) | {r['source_gb']:.2f} | {r['tensors']} | {r['written_gb']:.2f} | "
                f"{r['held_gb']:.2f} | {r['max_rank_gb']:.2f} | {r['files']} / {r['inodes']} | {r['seconds']:.1f} | {r['gb_s']:.2f} | "
                f"{r['cp_gb_s']:.2f} | {r['gb_s'] / r['cp_gb_s']:.2f} | {r['peak_anon_mib']:.0f} | {r['load_avg']:.1f} |")
        out.append(line + (f" {r['verify_s']:.1f} |" if v else ""))
    return out


def report(rows: list[dict], args: argparse.Namespace, run: Run) -> str:
    env = run.env
    widths = f"{args.preset} checkpoints" if args.preset else "full-width checkpoints"
    lines = [f"## shard ({time.strftime('%Y-%m-%d')})", "",
             f"`quantkit shard SRC DST --ep {args.ep} --tp {args.tp} --workers {args.workers}` on {widths} cut in depth "
             f"(source fill: {args.fill}). CPU only: {env['cpu']}; {env['os']}; python {env['python']}, torch {env['torch']}, "
             f"safetensors {env['safetensors']}, quantkit {env['quantkit']}, git {env['git']}.", "",
             f"Command: `{run.command}`", "", *table(rows, args.ep), "",
             "DeepSeek-V3 with 3 layers: layers 0-2 are dense (first_k_dense_replace 3) and the MTP layer 3 is the MoE "
             "layer (256 routed experts + 1 shared), with the MTP layer's own embed_tokens and shared_head.head.",
             "Written once = every group file counted once (replicated tensors and TP slices are hard-linked into the "
             "other rank directories); held = the sum over the rank directories. GB/s = written once / seconds, seconds "
             "= the shard call (plan, read, slice, sha256, write, link, manifest) plus a final sync. Copy baseline = "
             "shutil.copyfile of the same source files plus sync, measured just before on the same disk. The source "
             "was written just before, so it is partly in the page cache. Peak anon RSS = growth of RssAnon during "
             "the shard call (file pages excluded: whole tensors are read through safetensors' mmap). Load avg = the "
             "1-minute load average when the shard started (the machine is shared).", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    from . import prog
    from .env import environment

    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="scratch directory for sources and outputs")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--layers", nargs="*", default=[], help="per-model depth, e.g. deepseek-v3=3 gpt-oss-120b=2")
    p.add_argument("--ep", type=int, default=16)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="shard --workers (threads writing group files)")
    p.add_argument("--fill", choices=["fast", "synth"], default="fast")
    p.add_argument("--verify", action="store_true", help="also time quantkit.shard.verify on each output")
    p.add_argument("--append", type=Path, default=None, help="a markdown file to append the section to")
    p.add_argument("--keep", action="store_true", help="keep sources and outputs")
    p.add_argument("--preset", default=None, help="one synth preset for every model (default: each model's released widths)")
    args = p.parse_args(argv)
    layers = DEFAULT_LAYERS | {k: int(v) for k, v in (x.split("=") for x in args.layers)}
    args.work.mkdir(parents=True, exist_ok=True)
    run = Run.start(__name__, argv, environment("cpu"))
    rows = []
    for m in args.models:
        rows.append(run_one(m, layers[m], args))
        run.write(args.work / "results.jsonl", rows[-1], ("model",))
    text = report(rows, args, run)
    if args.append:
        fresh = not args.append.exists() or args.append.stat().st_size == 0
        with open(args.append, "a") as f:
            f.write(("# quantkit benchmarks\n\n" if fresh else "\n") + text)
    print(text)

