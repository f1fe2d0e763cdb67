"""Kernel benchmarks: one run builds, checks and times every kernel family against its baselines.

    quantkit bench kernels --out OUT [--append FILE] [--families gemm]
        [--sweep off|quick|full] [--shapes deepseek ...] [--ms 1 16 ...] [--budget-s 400] [--device cuda|cpu]

On a CUDA device every row is checked against the torch reference of its op, then timed three ways:

* eager: ``triton.testing.do_bench`` median, L2 flushed (256 MB memset) before every call.  A
  host launch slower than the flush kernel shows up here (the GPU waits for the launch);
* graph: the call captured in a CUDA graph, each call preceded by an L2 flush that reads 256 MB
  (leaving the L2 clean, as in a decode step; see ``timer.FLUSH_BYTES``), replayed; the
  flush-only graph's time is subtracted.  Decode serving runs in CUDA graphs, so this is the
  figure for small M;
* host: Python wall time per call of the launch alone (the GPU queue never fills).

GEMM runs a main pass (every shape and M with the baselines, the op's config tables, ``auto``
and the MXFP8 paths), then ``--sweep quick`` (default) times candidate configs on representative
shapes with the time left in ``--budget-s`` (graph timing only) and prints the best per M as
config-table rows to paste.  Without CUDA (``--device cpu``, a smoke test of this benchmark): the
Triton interpreter on shapes scaled down 32x, wall-clock timing, no cuBLAS, no graphs.

Writes, as it goes, OUT/bench.log, OUT/results.jsonl (one record per timing, :mod:`.record`) and after
each pass OUT/results.md (the section appended to FILE with ``--append FILE``), then prints a
short summary last.  Families are functions registered in :data:`FAMILIES`; they share the
timer (:mod:`.timer`), checks and rows (:mod:`.harness`) and the report here.  Shapes and goals are data at the top of each family.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable
from pathlib import Path

from . import gemm as bench_gemm  # the GEMM family
from .harness import Bench, bench_parser, describe, start

Checkpoint = Callable[[], object]  # writes OUT/results.md with the rows so far

# name -> (run, full report lines for results.md, short table printed last)
FAMILIES: dict[str, tuple[Callable[[Bench, argparse.Namespace, Checkpoint], None], Callable[[Bench], list[str]], Callable[[Bench], list[str]]]] = {
    "gemm": (bench_gemm.bench_gemm, bench_gemm.gemm_report, bench_gemm.gemm_short),
}


# ---- driver -----------------------------------------------------------------------------------

TIMING_NOTE = (
    "Times: **eager** = median of triton.testing.do_bench (L2 flushed by a 256 MB memset before each call; a host "
    "launch slower than that memset shows up as GPU idle time); **graph** = the call captured in a CUDA graph, each "
    "call preceded by an L2 flush that reads 256 MB (an amax: leaves the L2 clean, where a memset leaves dirty lines the "
    "next kernel must write back), replayed, minus a flush-only graph (decode serving runs in CUDA graphs: small-M "
    "goals are judged on it); **host** = Python time per call of the launch alone. TFLOPS, GB/s and roofline use the "
    "graph time where there is one. Roofline share = max(FLOPs/peak, bytes/HBM) / measured time."
)


def write_report(b: Bench, families: list[str], args: argparse.Namespace, final: bool) -> list[str]:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        f"## Kernel benchmarks, {stamp}",
        "",
        f"Device: {b.gpu}; peaks used: FP8 {b.peaks[0]:g} / BF16 {b.peaks[1]:g} dense TFLOPS, HBM {b.peaks[2]:g} GB/s. "
        + describe(b.run.env),
        f"Command: `{b.run.command}`.",
        "",
        TIMING_NOTE,
        "",
        *[f"- {n}" for n in b.notes],
        "",
    ]
    body: list[str] = []
    for fam in families:
        body += [f"### {fam}", "", *FAMILIES[fam][1](b), ""]
    errors = [r for r in b.rows if r.check.startswith(("error", "FAIL")) or "graph error" in r.note]
    tail = [f"Checks failed or errors: {len(errors)}"] + [f"- {r.case} M={r.m} {r.backend}: {r.check} {r.note}" for r in errors[:40]]
    tail += [f"Skipped: {', '.join(b.skipped)}"] if b.skipped else []
    text = head + body + tail + [""]
    (b.out / "results.md").write_text("\n".join(text))
    if final and args.append:
        path = Path(args.append)
        if not path.exists():
            path.write_text("# Benchmarks\n\nMeasured figures, newest last; each section is one run of `quantkit bench`.\n\n")
        with open(path, "a") as f:
            f.write("\n".join(text) + "\n")
    return body + tail


def main(argv: list[str]) -> None:
    p = bench_parser(__name__, __doc__, budget_s=400.0, rep_ms=30)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--shapes", nargs="*", help="substrings of 'model projection' to keep, e.g. deepseek")
    p.add_argument("--ms", nargs="*", type=int, help="M values (default: 1 16 64 128 1024 4096 8192)")
    p.add_argument("--sweep", choices=("off", "quick", "full"), default="quick",
                   help="after the main pass, time candidate configs: quick = 4 representative shapes, 6 M values; full = all")  # fmt: skip
    args = p.parse_args(argv)
    b = start(__name__, argv, args)
    b.log(f"kernels: {b.gpu} {b.run.env} families={args.families} sweep={args.sweep} budget={args.budget_s:.0f} s")
    t0 = time.monotonic()
    for fam in args.families:
        FAMILIES[fam][0](b, args, lambda: write_report(b, args.families, args, final=False))
    summary = write_report(b, args.families, args, final=True)
    b.log(f"\n==== summary ({time.monotonic() - t0:.0f} s; full table in {args.out / 'results.md'}) ====")
    for line in summary:
        if not line.startswith("|"):
            b.log(line)
    for fam in args.families:
        b.log(f"\n{fam}:")
        for line in FAMILIES[fam][2](b):
            b.log(line)

