"""Weight-absorbed MLA decode benchmark (DeepSeek-V3: 128 heads, rank 512, rope 64, bf16 cache, 16-token pages).

    quantkit bench mla --out OUT [--budget-s 300] [--fi-backends auto] [--no-sweep]
        [--append FILE] [--device cuda|cpu]

Timing, logging and result rows are :mod:`.harness`'s (``Bench``: do_bench median with L2
flushed before every call, so the latent cache comes from HBM; also replayed from a CUDA graph,
each call after a flush that reads 256 MB and leaves the L2 clean: how decode is served).  For
batch 1..128 x context 1k..16k (combinations whose inputs would not fit in half the free device
memory are skipped and listed), every backend of ``mla_decode`` is first checked against the
float32 torch reference on the first and last sequence (|err| <= 1e-2 |ref| + 1e-2 max|ref|, plus
one bf16 ulp), then timed:

* Triton (:mod:`quantkit.kernels.mla.decode`, default launch configuration);
* FlashInfer's ``BatchMLAPagedAttentionWrapper`` (planned once, ``run`` timed), when
  ``import flashinfer`` works, for each of ``--fi-backends``.

GB/s = bytes one decode step must move / time: the latent and rope cache rows of every context
(B * ctx * (512 + 64) * 2) + q_lat and q_rot + o_lat; "HBM" is that rate over 4800 GB/s.  At 128
heads the step also does 2 * B * H * ctx * (2 * 512 + 64) FLOPs, ~242 per cache byte, above the
H200's bf16 ridge (989 TFLOPS / 4.8 TB/s ~ 206): at the full head count MLA decode is
compute-bound (with H / tp heads per rank it is memory-bound), so "roofline" (harness:
max(bytes / HBM, FLOPs / bf16 peak) / time) is the fairer share.  Then, while the budget
lasts, Triton launch configurations (block_h, block_n, warps, stages) at three points: the
rows of quantkit/kernels/mla/tables.py come from here.

``--device cpu`` is a smoke test of this benchmark: Triton's interpreter on tiny shapes.  Writes
OUT/bench.log as it goes, OUT/results.jsonl (one record per timing), OUT/results.md; prints the
short table last.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from .harness import Bench, bench_parser, best_row, close_check, describe, rows_table, fmt, lazy, load_flashinfer, pct, Row, start  # timers, rows, log

PAGE = 16
HBM_GBS = 4800.0  # H200 HBM3e, the figure the "HBM" column divides by
SWEEP = ((16, 32, 4, 2), (16, 32, 4, 3), (16, 64, 4, 2), (32, 32, 8, 2), (32, 64, 8, 2), (32, 32, 4, 2),
         (64, 32, 8, 2), (64, 64, 8, 2), (16, 16, 4, 3))


@dataclass(frozen=True)
class Shapes:
    heads: int = 128
    rank: int = 512
    rope: int = 64
    batch: tuple[int, ...] = (1, 16, 64, 128)
    ctx: tuple[int, ...] = (1024, 4096, 16384)

    @property
    def scale(self) -> float:
        return 192**-0.5  # (qk_nope 128 + rope 64) ** -0.5, before YaRN's mscale

    def step_bytes(self, b: int, ctx: int) -> float:
        """What one decode step must move: the context's cache rows, q_lat + q_rot, o_lat (bf16)."""
        return 2.0 * (b * ctx * (self.rank + self.rope) + b * self.heads * (2 * self.rank + self.rope))

    def step_flops(self, b: int, ctx: int) -> float:
        return 2.0 * b * self.heads * ctx * (2 * self.rank + self.rope)  # scores (rank + rope) + PV (rank)


CPU_SHAPES = Shapes(heads=4, rank=32, rope=16, batch=(1, 3), ctx=(32, 80))


def left(b: Bench) -> float:
    return b.deadline - time.monotonic()


def inputs(torch, dev, sh: Shapes, n: int, ctx: int):
    """Paged latent cache of n sequences of ctx tokens (shuffled pages), queries; all bf16."""
    g = torch.Generator(device=dev).manual_seed(n * 100003 + ctx)
    pages = n * -(-ctx // PAGE)
    kv = torch.randn(pages * PAGE, sh.rank, generator=g, device=dev, dtype=torch.bfloat16)
    k_rot = torch.randn(pages * PAGE, sh.rope, generator=g, device=dev, dtype=torch.bfloat16)
    bt = torch.randperm(pages, generator=g, device=dev).to(torch.int32).view(n, -1)
    q_lat = torch.randn(n, sh.heads, sh.rank, generator=g, device=dev, dtype=torch.bfloat16)
    q_rot = torch.randn(n, sh.heads, sh.rope, generator=g, device=dev, dtype=torch.bfloat16)
    return q_lat, q_rot, kv, k_rot, bt, torch.full((n,), ctx, dtype=torch.int32, device=dev)


def fits(torch, dev, sh: Shapes, n: int, ctx: int) -> bool:
    if dev.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(dev)
    return 2 * sh.step_bytes(n, ctx) < free / 2  # inputs, plus the split partials and the reference's copies


def checker(args, scale: float) -> Callable[[object], str]:
    """float32 reference (the op's torch backend on float32 queries; it converts one context at a
    time) for the first and last sequence; the check compares those rows."""
    from quantkit.kernels.mla.mla_ref import mla_decode

    q_lat, q_rot, kv, k_rot, bt, lens = args
    sel = sorted({0, q_lat.shape[0] - 1})
    ref = mla_decode(q_lat[sel].float(), q_rot[sel].float(), kv, k_rot, bt[sel], lens[sel], PAGE, scale)  # [2, H, rank]
    check = close_check(ref, 1e-2)
    return lambda out: check(out[sel])


def measure(b: Bench, sh: Shapes, n: int, ctx: int, backend: str, fn: Callable[[], object], check, note: str = "") -> Row:
    return b.measure("mla decode", f"B={n} ctx={ctx}", (n, ctx, sh.rank), backend, fn, sh.step_flops(n, ctx), sh.step_bytes(n, ctx),
                     b.peaks[1], check, note)  # fmt: skip


def flashinfer_run(b: Bench, sh: Shapes, fi, backend: str, args) -> Callable[[], object]:
    """Plan once (outside the timing), then the timed ``run``."""
    q_lat, q_rot, kv, k_rot, bt, lens = args
    a = fi.MLADecode(b.device, b.torch.bfloat16, sh.heads, sh.rank, sh.rope, scale=sh.scale, backend=backend)
    a.plan(bt, lens, PAGE)
    return lambda: a.run(q_lat, q_rot, kv, k_rot)


def bench_case(b: Bench, sh: Shapes, n: int, ctx: int, fi, fi_backends: list[str]) -> None:
    from quantkit.kernels.mla import decode as tri

    args = inputs(b.torch, b.device, sh, n, ctx)
    check = checker(args, sh.scale)
    measure(b, sh, n, ctx, "triton", lambda: tri.mla_decode(*args, PAGE, sh.scale), check)
    for fb in fi_backends if fi else ():  # planned on the first (untimed) call, inside measure's error capture
        measure(b, sh, n, ctx, f"flashinfer-{fb}", lazy(lambda fb=fb: flashinfer_run(b, sh, fi, fb, args)), check, note="planned once")


def bench_decode(b: Bench, sh: Shapes, fi, fi_backends: list[str]) -> None:
    for n in sh.batch:
        for ctx in sh.ctx:
            if left(b) < 20 or not fits(b.torch, b.device, sh, n, ctx):
                b.skipped.append(f"B={n} ctx={ctx} ({'time' if left(b) < 20 else 'memory'})")
                continue
            bench_case(b, sh, n, ctx, fi, fi_backends)


def sweep_point(b: Bench, sh: Shapes, n: int, ctx: int) -> bool:
    """Every SWEEP configuration at one point; False when the budget ran out."""
    from quantkit.kernels.mla import decode as tri

    args = inputs(b.torch, b.device, sh, n, ctx)
    check = checker(args, sh.scale)
    for cfg in (tri.MLAConfig(*c) for c in SWEEP):
        if left(b) < 10:
            return False
        run = functools.partial(tri.mla_decode, *args, PAGE, sh.scale, config=cfg)
        measure(b, sh, n, ctx, f"triton {cfg.name()}", run, check, note="sweep")
    return True


def bench_sweep(b: Bench, sh: Shapes) -> None:
    """Triton launch configurations at a split-heavy, a middle and a compute-heavy point."""
    points = [(sh.batch[0], sh.ctx[-1]), (sh.batch[len(sh.batch) // 2], sh.ctx[len(sh.ctx) // 2]), (sh.batch[-1], sh.ctx[-1])]
    for n, ctx in dict.fromkeys(points):
        if not fits(b.torch, b.device, sh, n, ctx):
            b.skipped.append(f"sweep B={n} ctx={ctx} (memory)")
        elif not sweep_point(b, sh, n, ctx):
            b.skipped.append("rest of the sweep")
            return


def summary(rows: list[Row]) -> list[str]:
    """Triton (defaults) against the best FlashInfer row per case; the best sweep configuration."""
    pick = functools.partial(best_row, rows)

    out = ["| case | triton ms | GB/s | HBM | roofline | TFLOPS | flashinfer ms (best) | flashinfer GB/s | triton / flashinfer | best sweep config |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for case in dict.fromkeys(r.case for r in rows if r.note != "sweep"):
        tri, fi, best = pick(case, lambda n: n == "triton"), pick(case, lambda n: n.startswith("flashinfer")), pick(case, lambda n: True, True)
        if tri is None:
            out.append(f"| {case} | error | | | | | | | | |")
            continue
        hbm = None if tri.gbs is None else tri.gbs / HBM_GBS
        fi_s, fi_gbs = (f"{fmt(fi.t)} ({fi.backend})", fmt(fi.gbs, 0)) if fi else ("-", "-")
        best_s = f"{best.backend.removeprefix('triton ')} {fmt(best.t)} ms" if best else "-"
        out.append(f"| {case} | {fmt(tri.t)} | {fmt(tri.gbs, 0)} | {pct(hbm)} | {pct(tri.roofline)} | {fmt(tri.tflops, 0)} | {fi_s} | {fi_gbs} | "
                   f"{fmt(tri.t / fi.t, 2) if fi else '-'} | {best_s} |")  # fmt: skip
    return out


def write_report(b: Bench, sh: Shapes, append: str | None) -> list[str]:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    short = summary(b.rows)
    full = rows_table(b.rows)
    text = [f"## MLA decode (weight-absorbed), {stamp}", "", f"Device: {b.gpu}; " + describe(b.run.env),
            f"Command: `{b.run.command}`.",
            (f"Shapes: H {sh.heads}, rank {sh.rank}, rope {sh.rope}, bf16 cache in pages of {PAGE}. GB/s on the bytes a step must move "
             f"(cache rows of the context + q + out); HBM = GB/s / {HBM_GBS:.0f}; roofline = max(bytes/HBM, FLOPs/bf16 peak) / time. "
             "Times: graph where measured, else eager."), "",
            *short, "", *([f"Skipped: {', '.join(b.skipped)}", ""] if b.skipped else []),
            "<details><summary>all rows</summary>", "", *full, "", "</details>", ""]  # fmt: skip
    (b.out / "results.md").write_text("\n".join(text))
    if append:
        with open(append, "a") as f:
            f.write("\n" + "\n".join(text))
    return short


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = bench_parser(__name__, __doc__, budget_s=300.0, rep_ms=40)
    p.add_argument("--fi-backends", default="auto", help="comma list of FlashInfer MLA backends (auto, fa2, fa3); '' for none")
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True)
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    b = start(__name__, argv, args)
    for name in ("bench.log", "results.jsonl"):
        (args.out / name).unlink(missing_ok=True)
    sh = CPU_SHAPES if b.device.type == "cpu" else Shapes()
    fi, fi_backends = load_flashinfer(b.cuda, args.fi_backends, b.run.env, "mla.flashinfer")
    b.log(f"mla: {b.gpu} {b.run.env}")
    t0 = time.monotonic()
    b.log(f"## decode ({left(b):.0f} s left)")
    bench_decode(b, sh, fi, fi_backends)
    if args.sweep:
        b.log(f"## sweep ({left(b):.0f} s left)")
        bench_sweep(b, sh)
    short = write_report(b, sh, args.append)
    failed = [r for r in b.rows if r.check.startswith(("FAIL", "error"))]
    b.log(f"\n==== MLA decode ({time.monotonic() - t0:.0f} s, {len(b.rows)} rows, {len(failed)} failed checks or errors; "
          f"full report {args.out / 'results.md'}) ====")  # fmt: skip
    for line in short:
        b.log(line)

