"""Shared by the kernel benchmarks (scripts/bench_kernels.py and its families): rows, the three
timers (eager, CUDA graph, host), correctness checks and number formatting.  See bench_kernels.py."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

# device name substring -> (dense FP8 TFLOPS, dense BF16 TFLOPS, HBM GB/s), NVIDIA datasheets
PEAKS: dict[str, tuple[float, float, float]] = {
    "H200 NVL": (1671.0, 835.0, 4800.0),
    "H200": (1979.0, 989.0, 4800.0),
    "H100 NVL": (1671.0, 835.0, 3900.0),
    "H100": (1979.0, 989.0, 3350.0),
}
CPU_PEAKS = (1.0, 1.0, 50.0)  # placeholder figures for the CPU smoke run
FLUSH_BYTES = 256 * 2**20  # as triton.testing.do_bench: several times the 50 MB L2
# The graph timer's flush READS its buffer (an amax): the L2 is left holding clean lines.  do_bench's flush is a memset,
# which leaves the L2 full of dirty lines that the next kernel's reads must write back: on the H200 that charged a plain
# read of a 36 MB weight 14.4 us instead of 11.0 (55% of HBM instead of 71%, ninth pass), a tax that falls hardest on the
# smallest memory-bound kernels.  In a decode step the kernel before a GEMM has mostly read weights, so clean lines are
# the serving case.
ROOT = Path(__file__).resolve().parents[1]


def read_flush(torch, device) -> Callable[[], object]:
    """The timers' L2 flush: a call reads FLUSH_BYTES (an amax into a scalar), leaving the L2 clean (see FLUSH_BYTES)."""
    buf = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    sink = torch.zeros((), dtype=torch.float32, device=device)
    return lambda: torch.amax(buf, out=sink)


def bench_parser(doc: str, budget_s: float, rep_ms: int, hbm: bool = False) -> argparse.ArgumentParser:
    """The arguments every kernel benchmark takes (what :func:`start_device` and :class:`Bench`
    read): --out, --append, --device, --warmup-ms, --rep-ms, --budget-s (and --hbm-gbs)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for bench.log, results.jsonl, results.md")
    p.add_argument("--append", default=None, metavar="FILE",
                   help="a markdown file to append the report to (never in a cpu run; docs/performance.md is checked "
                        "against docs/results/, so new figures go there)")  # fmt: skip
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu = interpreter smoke run of this script")
    p.add_argument("--warmup-ms", type=int, default=10)
    p.add_argument("--rep-ms", type=int, default=rep_ms)
    p.add_argument("--budget-s", type=float, default=budget_s, help="start no new case after this many seconds")
    if hbm:
        p.add_argument("--hbm-gbs", type=float, help="peak HBM GB/s (default: by device name)")
    return p


def start_device(args):
    """Common start of a kernel benchmark: ``--device cpu`` runs the Triton interpreter (set before
    quantkit.kernels imports triton) and never appends to the docs; imports torch from this tree's
    environment, checks CUDA, keeps float32 references true float32 (no TF32), makes ``args.out``.
    Returns (torch, device)."""
    import os
    import sys

    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        args.append = None  # smoke-run figures never go into the docs
    sys.path.insert(0, str(ROOT))  # benchmark the tree this script lives in
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu for the interpreter smoke run")
    torch.set_float32_matmul_precision("highest")
    args.out.mkdir(parents=True, exist_ok=True)
    return torch, torch.device(args.device)


def load_flashinfer(cuda: bool, fi_backends: str, versions: dict[str, str], module: str) -> tuple[object | None, list[str]]:
    """(quantkit's FlashInfer backend ``module`` of quantkit.kernels or None, the FlashInfer backend
    names to time); records FlashInfer's version, or why it is absent, in ``versions``."""
    names = [x for x in fi_backends.split(",") if x] if cuda else []
    if not names:
        return None, names
    try:
        import importlib

        import flashinfer

        versions["flashinfer"] = flashinfer.__version__
        return importlib.import_module(f"quantkit.kernels.{module}"), names
    except Exception as err:  # noqa: BLE001 -- logged and in the report; the other rows still run
        versions["flashinfer"] = f"absent ({type(err).__name__}: {str(err)[:80]})"
        return None, names


def lazy(make: Callable[[], Callable[[], object]]) -> Callable[[], object]:
    """A timed call whose setup (FlashInfer plan / JIT) runs on the first, untimed call, inside measure's error capture."""
    box: list[Callable[[], object]] = []

    def fn() -> object:
        if not box:
            box.append(make())
        return box[0]()

    return fn


def time_ms(fn: Callable[[], object], cuda: bool, warmup_ms: int, rep_ms: int) -> float:
    """Median time of ``fn`` in ms: triton's do_bench (L2 flushed) on CUDA, median of 3 on CPU."""
    if cuda:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[1] * 1e3


@dataclass
class Row:
    family: str
    case: str  # e.g. "deepseek-v3 o_proj"
    m: int
    n: int
    k: int
    backend: str
    ms: float | None  # eager (do_bench)
    graph_ms: float | None  # CUDA graph replay, L2 flushed
    host_us: float | None  # Python launch time per call
    tflops: float | None  # from graph_ms when measured, else ms
    gbs: float | None
    roofline: float | None  # roofline time / measured time
    check: str  # "ok 1.2e-05", "FAIL ...", "-" (not checked), "error: ..."
    note: str = ""

    @property
    def t(self) -> float | None:
        return self.graph_ms if self.graph_ms is not None else self.ms


def best_row(rows: list[Row], case: str, pred: Callable[[str], bool], sweep: bool = False) -> Row | None:
    """The fastest timed row of ``case`` whose backend satisfies ``pred``, among the sweep rows
    (``sweep``) or the others; None when there is none."""
    ok = [r for r in rows if r.case == case and (r.note == "sweep") == sweep and pred(r.backend) and r.t]
    return min(ok, key=lambda r: r.t) if ok else None


def rows_table(rows: list[Row], with_family: bool = False) -> list[str]:
    """Every row measured, as a markdown table (the full record under a report's short table)."""
    fam_h, fam_sep = ("| family ", "|---") if with_family else ("", "")
    out = [f"{fam_h}| case | backend | eager ms | graph ms | TFLOPS | GB/s | roofline | check | note |", f"{fam_sep}|---|---|---|---|---|---|---|---|---|"]
    out += [(f"| {r.family} " if with_family else "") + f"| {r.case} | {r.backend} | {fmt(r.ms)} | {fmt(r.graph_ms)} | {fmt(r.tflops, 1)} | "
            f"{fmt(r.gbs, 0)} | {pct(r.roofline)} | {r.check} | {r.note} |" for r in rows]  # fmt: skip
    return out


@dataclass
class Bench:
    """What every family uses: device, peaks, timers, log and the rows measured so far."""

    torch: object
    device: object
    gpu: str
    peaks: tuple[float, float, float]
    out: Path
    warmup_ms: int
    rep_ms: int
    deadline: float
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    _flush: Callable[[], object] | None = None
    _flush_graphs: dict = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def log(self, msg: str) -> None:
        print(msg, flush=True)
        with open(self.out / "bench.log", "a") as f:
            f.write(msg + "\n")

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def time_ms(self, fn: Callable[[], object]) -> float:
        return time_ms(fn, self.cuda, self.warmup_ms, self.rep_ms)

    def host_us(self, fn: Callable[[], object], calls: int = 20) -> float:
        """Python time per call, launches only (the GPU catches up after the clock stops)."""
        calls = calls if self.cuda else 2
        if self.cuda:
            self.torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t
        if self.cuda:
            self.torch.cuda.synchronize()
        return dt / calls * 1e6

    def graph_ms(self, fn: Callable[[], object], est_ms: float | None) -> float | None:
        """ms per call replayed from a CUDA graph, each call after an L2 flush; None below noise."""
        torch = self.torch
        if self._flush is None:
            self._flush = read_flush(torch, self.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs recommends
            fn()
        torch.cuda.current_stream().wait_stream(side)
        if est_ms is None:  # rough, L2 warm: only sizes the number of captured calls
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(3):
                fn()
            end.record()
            end.synchronize()
            est_ms = start.elapsed_time(end) / 3
        flush_ms = FLUSH_BYTES / (self.peaks[2] * 1e6)
        reps = max(2, min(20, int(4.0 / (est_ms + flush_ms))))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                self.l2_flush()
                fn()
        base = self._flush_graph(reps)
        diffs = [(self._replay_ms(graph) - self._replay_ms(base)) / reps for _ in range(5)]
        del graph
        ms = statistics.median(diffs)
        return ms if ms > 0 else None

    def l2_flush(self) -> None:
        """Evict the L2 by reading FLUSH_BYTES (:func:`read_flush`)."""
        self._flush()

    def _flush_graph(self, reps: int):
        if reps not in self._flush_graphs:
            g = self.torch.cuda.CUDAGraph()
            with self.torch.cuda.graph(g):
                for _ in range(reps):
                    self.l2_flush()
            self._flush_graphs[reps] = g
        return self._flush_graphs[reps]

    def _replay_ms(self, graph) -> float:
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        with open(self.out / "results.jsonl", "a") as f:
            f.write(json.dumps(asdict(row)) + "\n")
        return row

    def measure(self, family: str, case: str, mnk: tuple[int, int, int], backend: str, fn: Callable[[], object],
                flops: float, nbytes: float, peak_tflops: float, check: Callable[[object], str] | None, note: str = "",
                eager: bool = True, graph: bool = True, host: bool = False) -> Row:  # fmt: skip
        """Run once (compiles), check, time; an exception becomes an "error" row, never a silent skip."""
        m, n, k = mnk
        try:
            result = fn()
            verdict = check(result) if check else "-"
            del result
            ms = self.time_ms(fn) if eager else None
            host_us = self.host_us(fn) if host else None
        except Exception as err:  # noqa: BLE001 -- recorded in the report and the log, the run goes on
            return self.add(Row(family, case, m, n, k, backend, None, None, None, None, None, None, self._error(err, f"{case} M={m} {backend}"), note))
        g = None
        if graph and self.cuda:
            try:
                g = self.graph_ms(fn, ms)
            except Exception as err:  # noqa: BLE001 -- the eager figure stands; the note says why there is no graph one
                note = f"{note} graph {self._error(err, f'{case} M={m} {backend} (graph)')}".strip()
        t = (g if g is not None else ms or 0.0) * 1e-3
        roof = max(flops / (peak_tflops * 1e12), nbytes / (self.peaks[2] * 1e9))
        rates = (flops / t / 1e12, nbytes / t / 1e9, roof / t) if t > 0 else (None, None, None)
        row = Row(family, case, m, n, k, backend, ms, g, host_us, *rates, verdict, note)
        self.log(f"  {case:<26} M={m:<5} {backend:<13} eager {fmt(ms)} graph {fmt(g)} ms host {fmt(host_us, 0)} us "
                 f"{fmt(row.tflops, 1)} TFLOPS {fmt(row.gbs, 0)} GB/s roof {pct(row.roofline)}  {verdict}  {note}")  # fmt: skip
        return self.add(row)

    def _error(self, err: Exception, where: str) -> str:
        msg = f"error: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
        self.log(f"  {where}: {msg}")
        with open(self.out / "bench.log", "a") as f:
            f.write(traceback.format_exc() + "\n")
        return msg


def close_check(ref, rel: float) -> Callable[[object], str]:
    """|out - ref| <= (rel + 1 bf16 ulp) |ref| + rel max|ref| elementwise; the verdict names the worst element."""

    def check(out) -> str:
        o, r = out.float(), ref.float()
        if o.shape != r.shape:
            return f"FAIL shape {tuple(o.shape)} != {tuple(r.shape)}"
        scale = r.abs().max().clamp(min=1e-30)
        ulp = 2.0**-7 if out.dtype.itemsize == 2 else 0.0
        excess = (o - r).abs() - (rel + ulp) * r.abs() - rel * scale
        i = int(excess.argmax())
        norm_rel = float((o - r).norm() / r.norm().clamp(min=1e-30))
        if float(excess.flatten()[i]) > 0 or not math.isfinite(norm_rel):
            row, col = divmod(i, r.shape[-1])
            return f"FAIL at [{row},{col}] got {float(o.flatten()[i]):.5g} want {float(r.flatten()[i]):.5g} (rel {norm_rel:.2e})"
        return f"ok {norm_rel:.1e}"

    return check


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fmt(x: float | None, nd: int = 4) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"
