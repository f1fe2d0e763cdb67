"""Shared by the kernel benchmarks (kernels and its families, moe, attention, mla, formats, fused-quant, the
sweeps): their common options, the start of a run (device, environment record, peaks, :class:`.timer.Timer`,
:class:`.record.Run`), rows measured and checked with the timer, correctness checks and number formatting."""

from __future__ import annotations

import argparse
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .record import Run
from .timer import Timer

ROW_PARAMS = ("family", "case", "m", "n", "k", "backend")  # what identifies a Row in its record; the rest are metrics


def bench_parser(module: str, doc: str, budget_s: float, rep_ms: int, hbm: bool = False, append: bool = True) -> argparse.ArgumentParser:
    """The arguments every kernel benchmark takes (what :func:`start` reads): --out, --device, --warmup-ms,
    --rep-ms, --budget-s, and --append (a benchmark with a report) and --hbm-gbs (one that takes it)."""
    from . import prog

    p = argparse.ArgumentParser(prog=prog(module), description=doc.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for bench.log, results.jsonl, results.md")
    if append:
        p.add_argument("--append", default=None, metavar="FILE",
                       help="a markdown file to append the report to (never in a cpu run; docs/performance.md is checked "
                            "against docs/results/, so new figures go there)")  # fmt: skip
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu = interpreter smoke run of this benchmark")
    p.add_argument("--warmup-ms", type=int, default=10)
    p.add_argument("--rep-ms", type=int, default=rep_ms)
    p.add_argument("--budget-s", type=float, default=budget_s, help="start no new case after this many seconds")
    if hbm:
        p.add_argument("--hbm-gbs", type=float, help="peak HBM GB/s (default: by device name)")
    return p


def start_device(args):
    """Common start of a kernel benchmark: ``--device cpu`` runs the Triton interpreter (set before
    quantkit.kernels imports triton) and never appends to the docs; checks CUDA, keeps float32
    references true float32 (no TF32), makes ``args.out``.  Returns (torch, device)."""
    import os

    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        args.append = None  # smoke-run figures never go into the docs
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; use --device cpu for the interpreter smoke run")
    torch.set_float32_matmul_precision("highest")
    args.out.mkdir(parents=True, exist_ok=True)
    return torch, torch.device(args.device)


def start(module: str, argv: list[str], args: argparse.Namespace) -> Bench:
    """A kernel benchmark's :class:`Bench` from its parsed :func:`bench_parser` arguments: the device
    (:func:`start_device`), the environment record, the device's peaks (``--hbm-gbs`` overrides the HBM
    figure), the timer and the run whose records the rows become."""
    from .env import environment, peaks

    torch, device = start_device(args)
    env = environment(args.device)
    pk, hbm = peaks(env["device"]), getattr(args, "hbm_gbs", None)
    if hbm:
        pk = (*(pk or (math.nan, math.nan))[:2], hbm)
    if pk is None:
        raise SystemExit(f"no peak figures for {env['device']!r}: add it to PEAKS in quantkit/bench/env.py"
                         + (" or pass --hbm-gbs" if hasattr(args, "hbm_gbs") else ""))  # fmt: skip
    name = env["device"] + (" (Triton interpreter)" if device.type == "cpu" else "")
    timer = Timer(torch, device, args.warmup_ms, args.rep_ms, pk[2])
    return Bench(torch, device, name, pk, args.out, timer, Run.start(module, argv, env), time.monotonic() + args.budget_s)


def describe(env: dict[str, str]) -> str:
    """The environment record as a report line (the device is named on its own)."""
    return ", ".join(f"{k} {v}" for k, v in env.items() if k != "device")


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
    """What every family uses: device, peaks, the timer, the run (its records), log and the rows measured so far."""

    torch: object
    device: object
    gpu: str
    peaks: tuple[float, float, float]
    out: Path
    timer: Timer
    run: Run
    deadline: float
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

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
        return self.timer.eager_ms(fn)

    def host_us(self, fn: Callable[[], object], calls: int = 20) -> float:
        return self.timer.host_us(fn, calls)

    def graph_ms(self, fn: Callable[[], object], est_ms: float | None) -> float | None:
        return self.timer.graph_ms(fn, est_ms)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        self.run.write(self.out / "results.jsonl", row, ROW_PARAMS)
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
