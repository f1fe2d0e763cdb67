#!/usr/bin/env python
"""Sink attention benchmark (GPT-OSS: 64 q / 8 kv heads, head_dim 64, sinks, window 128).

    python scripts/bench_attention.py --out OUT [--budget-s 280] [--fi-backends auto] [--no-sweep]
        [--append docs/benchmarks.md] [--device cuda|cpu]

On CUDA: every backend is first checked against the torch reference on the benchmark's own
inputs (float32 reference on a slice of queries), then timed with ``triton.testing.do_bench``
(median, L2 flushed before every call, so the KV cache comes from HBM):

* prefill, 8192 tokens in one sequence and a ragged batch of ~8k tokens, window 128 and full:
  Triton (ragged k/v, and the 16-token paged cache), FlashInfer's sink variant (ragged, and its
  ``BatchAttentionWithAttentionSinkWrapper`` on the paged cache), torch SDPA without sinks
  (flash for full causal, a boolean mask for the window; a per-sequence loop for ragged);
  TFLOPS = 4 * Hq * D * (visible query-key pairs) / time, against 989 dense bf16 TFLOPS.
* decode over the paged cache (16-token pages), batch 1..64 x context 1k..32k: Triton,
  FlashInfer (planned once, ``run`` timed), SDPA on a contiguous cache without sinks;
  GB/s = K+V bytes the step must read / time, against HBM 4.8 TB/s.
* then, with the time left, Triton launch configurations on the two 8192-token prefills and
  two decode points (the defaults in quantkit/kernels/attention_triton{,_decode}.py come from here).

FlashInfer runs when ``import flashinfer`` works (its wheel on PYTHONPATH); its first use
JIT-compiles one module per window setting (~40 s each).  ``--device cpu`` is a smoke test of
this script: Triton's interpreter on tiny shapes, wall-clock timing.  Writes OUT/bench.log as it
goes, OUT/results.jsonl (one row per timing), OUT/results.md; prints the short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HQ, HKV, D, WINDOW, PAGE = 64, 8, 64, 128, 16
PEAK_TFLOPS, HBM_GBS = 989.0, 4800.0  # H200 dense bf16, HBM3e
PREFILL = {"single": [8192], "ragged": [3000, 2048, 1500, 1000, 500, 100, 33, 1]}
DECODE_BATCH, DECODE_CTX = (1, 8, 32, 64), (1024, 4096, 16384, 32768)
GOALS = {"prefill_vs_flashinfer": 1.3, "decode_hbm": 0.60}
CPU_SHAPES = dict(hq=4, hkv=2, d=16, prefill={"single": [64], "ragged": [40, 17, 5]}, batch=(1, 3), ctx=(32, 80), window=8)


@dataclass
class Row:
    section: str
    case: str
    backend: str
    ms: float | None
    tflops: float | None
    gbs: float | None
    peak_share: float | None  # of the bf16 peak (prefill) or of HBM bandwidth (decode)
    check: str
    note: str = ""


@dataclass
class Bench:
    torch: object
    dev: object
    out: Path
    deadline: float
    rows: list[Row] = field(default_factory=list)

    def log(self, msg: str) -> None:
        print(msg, flush=True)
        with open(self.out / "bench.log", "a") as f:
            f.write(msg + "\n")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def time_ms(self, fn: Callable[[], object]) -> float:
        if self.dev.type == "cuda":
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=20, rep=80, return_mode="median"))
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def measure(self, section: str, case: str, backend: str, fn: Callable[[], object], flops: float, nbytes: float,
                check: Callable[[object], str] | None, note: str = "") -> Row:
        """Run once (compiles), check, time; an exception becomes an error row in the table and the log."""
        try:
            verdict = check(fn()) if check else "-"
            ms = self.time_ms(fn)
        except Exception as err:  # noqa: BLE001 -- reported in the table and the log, the run goes on
            msg = f"error: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:150]}"
            self.log(f"  {case:<22} {backend:<18} {msg}")
            with open(self.out / "bench.log", "a") as f:
                f.write(traceback.format_exc() + "\n")
            return self._add(Row(section, case, backend, None, None, None, None, msg, note))
        s = ms * 1e-3
        tf, gbs = flops / s / 1e12, nbytes / s / 1e9
        share = tf / PEAK_TFLOPS if section == "prefill" else gbs / HBM_GBS
        self.log(f"  {case:<22} {backend:<18} {ms:9.4f} ms {tf:7.1f} TFLOPS {gbs:7.0f} GB/s {share:6.1%}  {verdict}  {note}")
        return self._add(Row(section, case, backend, ms, tf, gbs, share, verdict, note))

    def _add(self, row: Row) -> Row:
        self.rows.append(row)
        with open(self.out / "results.jsonl", "a") as f:
            f.write(json.dumps(asdict(row)) + "\n")
        return row


def closeness(ref, atol: float = 1e-2, rtol: float = 1e-2) -> Callable[[object], str]:
    """Verdict on out (rows aligned with the float32 ``ref``): ok with the max error, or FAIL at the worst element."""

    def check(out) -> str:
        o = out.float()
        err = (o - ref).abs()
        excess = err - (atol + rtol * ref.abs())
        if not bool(excess.isfinite().all()) or float(excess.max()) > 0:
            i = int(excess.nan_to_num(float("inf")).argmax())
            return f"FAIL max err {float(err.max()):.3g} at flat {i}: got {float(o.flatten()[i]):.4g} want {float(ref.flatten()[i]):.4g}"
        return f"ok {float(err.max()):.1e}"

    return check


def pairs(lens: list[int], window: int | None) -> int:
    """Visible (query, key) pairs of causal self-attention over ``lens``."""
    total = 0
    for n in lens:
        w = n if window is None else min(window, n)
        total += w * (w + 1) // 2 + (n - w) * w
    return total


def to_pages(torch, k, v, lens: list[int], gen):
    """Scatter ragged k/v [T, Hkv, D] into a paged cache with shuffled 16-token pages: (kc, vc, block table int32)."""
    need = [-(-n // PAGE) for n in lens]
    perm = torch.randperm(sum(need), generator=gen).to(k.device)
    bt = torch.full((len(lens), max(need)), -1, dtype=torch.int32, device=k.device)
    kc = torch.zeros(sum(need) * PAGE, *k.shape[1:], dtype=k.dtype, device=k.device)
    vc = torch.zeros(sum(need) * PAGE, *v.shape[1:], dtype=v.dtype, device=v.device)
    start = page = 0
    for b, n in enumerate(lens):
        bt[b, : need[b]] = perm[page : page + need[b]].to(torch.int32)
        rows = (bt[b, : need[b]].long()[:, None] * PAGE + torch.arange(PAGE, device=k.device)).flatten()[:n]
        kc[rows], vc[rows] = k[start : start + n], v[start : start + n]
        start, page = start + n, page + need[b]
    return kc, vc, bt


@dataclass(frozen=True)
class Shapes:
    hq: int = HQ
    hkv: int = HKV
    d: int = D
    prefill: dict[str, list[int]] = field(default_factory=lambda: PREFILL)
    batch: tuple[int, ...] = DECODE_BATCH
    ctx: tuple[int, ...] = DECODE_CTX
    window: int = WINDOW


def lazy(make: Callable[[], Callable[[], object]]) -> Callable[[], object]:
    """A timed call whose setup (FlashInfer plan / JIT) runs on the first, untimed call, inside measure's error capture."""
    box: list[Callable[[], object]] = []

    def fn() -> object:
        if not box:
            box.append(make())
        return box[0]()

    return fn


def prefill_reference(torch, q, k, v, lens, sinks, window, scale):
    """float32 reference on the first and last 32 queries of each sequence: (out rows [n, Hq, D], their row indices)."""
    from quantkit.kernels.attention import attend

    outs, rows, start = [], [], 0
    for n in lens:
        m = min(32, n)
        sel = torch.unique(torch.cat((torch.arange(m), torch.arange(n - m, n)))).to(q.device)
        k_pos = torch.arange(n, device=q.device)
        outs.append(attend(q[start + sel].float(), k[start : start + n].float(), v[start : start + n].float(), sel, k_pos, scale, sinks, window))
        rows.append(start + sel)
        start += n
    return torch.cat(outs), torch.cat(rows)


def sdpa_prefill(torch, q, k, v, lens, window, scale):
    """torch SDPA per sequence, no sinks: causal flash, or a boolean window mask with k/v expanded to Hq heads."""
    import torch.nn.functional as F

    rep = q.shape[1] // k.shape[1]
    segs, start = [], 0
    for n in lens:
        qs, ks, vs = (t[start : start + n].transpose(0, 1)[None] for t in (q, k, v))
        if window is None:
            segs.append((qs, ks, vs, None))
        else:
            pos = torch.arange(n, device=q.device)
            mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
            segs.append((qs, ks.repeat_interleave(rep, 1), vs.repeat_interleave(rep, 1), mask))
        start += n

    def run():
        return [F.scaled_dot_product_attention(a, b, c, attn_mask=m, is_causal=m is None, scale=scale, enable_gqa=m is None)
                for a, b, c, m in segs]

    return run


def bench_prefill(bench: Bench, sh: Shapes, fi, fi_backends: list[str]) -> None:
    torch = bench.torch
    from quantkit.kernels import attention_triton as tri

    g, scale, bf16 = torch.Generator().manual_seed(0), sh.d**-0.5, torch.bfloat16
    for name, lens in sh.prefill.items():
        t = sum(lens)
        q, k, v = (torch.randn(t, h, sh.d, generator=g).to(bf16).to(bench.dev) for h in (sh.hq, sh.hkv, sh.hkv))
        sinks = (torch.randn(sh.hq, generator=g) * 2).to(bench.dev)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=bench.dev)
        kc, vc, bt = to_pages(torch, k, v, lens, g)
        lens_t = torch.tensor(lens, dtype=torch.int32, device=bench.dev)
        for window in (None, sh.window):
            case = f"{name} {t} {'swa' + str(window) if window else 'full'}"
            want, rows = prefill_reference(torch, q, k, v, lens, sinks, window, scale)
            check = (lambda w, r: lambda out: closeness(w)(out[r]))(want, rows)
            flops = 4.0 * sh.hq * sh.d * pairs(lens, window)
            mk = dict(flops=flops, nbytes=0.0, check=check)
            bench.measure("prefill", case, "triton", lambda: tri.attention_prefill(q, k, v, cu, cu, scale, sinks, window, max_seqlen_q=max(lens)), **mk)
            bench.measure("prefill", case, "triton paged16",
                          lambda: tri.attention_prefill(q, kc, vc, cu, cu, scale, sinks, window, bt, PAGE, max(lens)), **mk)
            for fb in fi_backends if fi else ():
                def ragged(fb=fb, window=window):
                    a = fi.SinkAttention(bench.dev, bf16, sh.hq, sh.hkv, sh.d, scale=scale, window=window, backend=fb)
                    a.plan_ragged(cu, cu)
                    return lambda: a.run(q, k, v, sinks)

                def paged(fb=fb, window=window):
                    a = fi.SinkAttention(bench.dev, bf16, sh.hq, sh.hkv, sh.d, scale=scale, window=window, backend=fb)
                    a.plan_paged(cu, bt, lens_t, PAGE)
                    return lambda: a.run(q, kc, vc, sinks)

                bench.measure("prefill", case, f"flashinfer-{fb}", lazy(ragged), **mk, note="ragged, sink variant")
                bench.measure("prefill", case, f"flashinfer-{fb} paged16", lazy(paged), **mk, note="SinkWrapper")
            bench.measure("prefill", case, "torch sdpa", sdpa_prefill(torch, q, k, v, lens, window, scale), flops, 0.0, None, note="no sinks")
        del q, k, v, kc, vc


def decode_inputs(torch, dev, sh: Shapes, b: int, ctx: int):
    """Paged cache of b sequences of ctx tokens (shuffled 16-token pages), q [b, Hq, D], sinks [Hq]."""
    g = torch.Generator(device=dev).manual_seed(b * 100003 + ctx)
    pages = b * -(-ctx // PAGE)
    kc = torch.randn(pages * PAGE, sh.hkv, sh.d, generator=g, device=dev, dtype=torch.bfloat16)
    vc = torch.randn(pages * PAGE, sh.hkv, sh.d, generator=g, device=dev, dtype=torch.bfloat16)
    bt = torch.randperm(pages, generator=g, device=dev).to(torch.int32).view(b, -1)
    q = torch.randn(b, sh.hq, sh.d, generator=g, device=dev, dtype=torch.bfloat16)
    sinks = torch.randn(sh.hq, generator=g, device=dev) * 2
    return kc, vc, bt, torch.full((b,), ctx, dtype=torch.int32, device=dev), q, sinks


def decode_check(torch, q, kc, vc, bt, ctx, sinks, window, scale):
    """float32 reference for the first and last sequence; the check compares those rows."""
    from quantkit.kernels.attention import attend, paged_rows

    sel = sorted({0, q.shape[0] - 1})
    want = []
    for b in sel:
        r = paged_rows(bt, b, ctx, PAGE)
        pos = torch.arange(ctx, device=q.device)
        want.append(attend(q[b : b + 1].float(), kc[r].float(), vc[r].float(), pos[-1:], pos, scale, sinks, window))
    ref = torch.cat(want)
    return lambda out: closeness(ref)(out[sel])


def bench_decode(bench: Bench, sh: Shapes, fi, fi_backends: list[str]) -> None:
    torch = bench.torch
    import torch.nn.functional as F

    from quantkit.kernels import attention_triton_decode as tri

    scale = sh.d**-0.5
    cases = [(b, c, None) for b in sh.batch for c in sh.ctx] + [(sh.batch[0], sh.ctx[-1], sh.window), (sh.batch[-1], sh.ctx[-1], sh.window)]
    for b, ctx, window in cases:
        if bench.left() < 30:
            bench.log(f"  decode B={b} ctx={ctx}: skipped, out of time")
            continue
        kc, vc, bt, lens, q, sinks = decode_inputs(torch, bench.dev, sh, b, ctx)
        case = f"B={b} ctx={ctx}" + (f" swa{window}" if window else "")
        nbytes = 2.0 * b * min(ctx, window or ctx) * sh.hkv * 2 * sh.d  # bf16 K and V rows the step reads
        mk = dict(flops=4.0 * b * sh.hq * sh.d * min(ctx, window or ctx), nbytes=nbytes, check=decode_check(torch, q, kc, vc, bt, ctx, sinks, window, scale))
        bench.measure("decode", case, "triton", lambda: tri.attention_decode(q, kc, vc, bt, lens, PAGE, scale, sinks, window), **mk)
        for fb in fi_backends if fi else ():
            def planned(fb=fb, window=window):
                a = fi.SinkAttention(bench.dev, torch.bfloat16, sh.hq, sh.hkv, sh.d, scale=scale, window=window, backend=fb)
                a.plan_paged(torch.arange(b + 1, dtype=torch.int32, device=bench.dev), bt, lens, PAGE)
                return lambda: a.run(q, kc, vc, sinks)

            bench.measure("decode", case, f"flashinfer-{fb}", lazy(planned), **mk, note="SinkWrapper")
        if window is None:
            kk, vv = (torch.randn(b, sh.hkv, ctx, sh.d, device=bench.dev, dtype=torch.bfloat16) for _ in range(2))
            q4 = q[:, :, None, :]
            bench.measure("decode", case, "torch sdpa", lambda: F.scaled_dot_product_attention(q4, kk, vv, scale=scale, enable_gqa=True),
                          mk["flops"], nbytes, None, note="contiguous, no sinks")
            del kk, vv
        del kc, vc


PREFILL_SWEEP = ((128, 64, 4, 3), (128, 64, 4, 2), (128, 64, 4, 4), (128, 128, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3),
                 (64, 128, 4, 3), (128, 64, 8, 3), (128, 128, 4, 2), (256, 64, 8, 2))
DECODE_SWEEP = ((64, 4, 3), (32, 4, 3), (128, 4, 3), (128, 8, 3), (64, 4, 2), (64, 4, 4), (256, 8, 3), (128, 4, 4), (32, 2, 4))


def bench_sweep(bench: Bench, sh: Shapes) -> None:
    """Triton launch configurations (block_m, block_n, warps, stages) / (block_n, warps, stages)."""
    torch = bench.torch
    from quantkit.kernels import attention_triton as tri
    from quantkit.kernels import attention_triton_decode as trid

    g, scale, n = torch.Generator().manual_seed(1), sh.d**-0.5, sh.prefill["single"][0]
    q, k, v = (torch.randn(n, h, sh.d, generator=g).to(torch.bfloat16).to(bench.dev) for h in (sh.hq, sh.hkv, sh.hkv))
    sinks = torch.randn(sh.hq, generator=g).to(bench.dev)
    cu = torch.tensor([0, n], dtype=torch.int32, device=bench.dev)
    for window in (None, sh.window):
        want, rows = prefill_reference(torch, q, k, v, [n], sinks, window, scale)
        flops = 4.0 * sh.hq * sh.d * pairs([n], window)
        for cfg in (tri.PrefillConfig(*c) for c in PREFILL_SWEEP):
            if bench.left() < 15:
                return bench.log("  sweep: out of time")
            run = (lambda c, w: lambda: tri.attention_prefill(q, k, v, cu, cu, scale, sinks, w, max_seqlen_q=n, config=c))(cfg, window)
            bench.measure("prefill", f"single {n} {'swa' + str(window) if window else 'full'}", f"triton {cfg.name()}", run, flops, 0.0,
                          (lambda r: lambda out: closeness(want)(out[r]))(rows), note="sweep")
    for b, ctx in ((sh.batch[0], sh.ctx[-1]), (sh.batch[-1], sh.ctx[1])):
        kc, vc, bt, lens, q, sinks = decode_inputs(torch, bench.dev, sh, b, ctx)
        check = decode_check(torch, q, kc, vc, bt, ctx, sinks, None, scale)
        for cfg in (trid.DecodeConfig(*c) for c in DECODE_SWEEP):
            if bench.left() < 10:
                return bench.log("  sweep: out of time")
            run = (lambda c: lambda: trid.attention_decode(q, kc, vc, bt, lens, PAGE, scale, sinks, config=c))(cfg)
            bench.measure("decode", f"B={b} ctx={ctx}", f"triton {cfg.name()}", run, 4.0 * b * sh.hq * sh.d * ctx,
                          2.0 * b * ctx * sh.hkv * 2 * sh.d, check, note="sweep")


def summary(rows: list[Row]) -> list[str]:
    """The short table: Triton (defaults) against the best FlashInfer row and SDPA, per case; best sweep config."""
    def pick(case: str, pred: Callable[[str], bool]) -> Row | None:
        ok = [r for r in rows if r.case == case and r.note != "sweep" and pred(r.backend) and r.ms]
        return min(ok, key=lambda r: r.ms) if ok else None

    out = ["| case | triton ms | triton | flashinfer ms (best) | triton / flashinfer | goal | sdpa ms | best sweep config |",
           "|---|---|---|---|---|---|---|---|"]
    for case in dict.fromkeys(r.case for r in rows if r.note != "sweep"):
        tri, fi, sd = pick(case, lambda b: b == "triton"), pick(case, lambda b: b.startswith("flashinfer")), pick(case, lambda b: b == "torch sdpa")
        if tri is None:
            out.append(f"| {case} | error | | | | | | |")
            continue
        sweep = [r for r in rows if r.note == "sweep" and r.ms and r.case == case]
        best = min(sweep, key=lambda r: r.ms) if sweep else None
        metric = f"{tri.tflops:.0f} TFLOPS ({tri.peak_share:.0%})" if tri.section == "prefill" else f"{tri.gbs:.0f} GB/s ({tri.peak_share:.0%} HBM)"
        fi_s = f"{fi.ms:.4f} ({fi.backend})" if fi else "-"
        ratio = f"{tri.ms / fi.ms:.2f}" if fi else "-"
        if tri.section == "prefill":
            goal = "-" if fi is None else ("met" if tri.ms / fi.ms <= GOALS["prefill_vs_flashinfer"] else "missed")
        else:
            goal = "met" if tri.peak_share >= GOALS["decode_hbm"] else "missed"
        best_s = f"{best.backend.removeprefix('triton ')} {best.ms:.4f} ms" if best else "-"
        out.append(f"| {case} | {tri.ms:.4f} | {metric} | {fi_s} | {ratio} | {goal} | {f'{sd.ms:.4f}' if sd else '-'} | {best_s} |")
    return out


def versions(torch) -> str:
    import triton

    parts = [f"torch {torch.__version__}", f"triton {triton.__version__}", f"python {platform.python_version()}"]
    try:
        import flashinfer

        parts.append(f"flashinfer {flashinfer.__version__}")
    except Exception as err:  # noqa: BLE001 -- the report says why FlashInfer is absent
        parts.append(f"flashinfer absent ({type(err).__name__}: {str(err)[:80]})")
    return ", ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no new decode or sweep timing after this many seconds")
    ap.add_argument("--fi-backends", default="auto", help="comma list of FlashInfer backends (auto, fa2, fa3); '' for none")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--append", type=Path, help="append OUT/results.md to this file (e.g. docs/benchmarks.md)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before quantkit.kernels is imported (Triton reads it then)
    sys.path.insert(0, str(ROOT))
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("bench.log", "results.jsonl"):
        (args.out / name).unlink(missing_ok=True)
    dev = torch.device(args.device)
    bench = Bench(torch, dev, args.out, time.monotonic() + args.budget_s)
    cpu = dev.type == "cpu"
    sh = Shapes(CPU_SHAPES["hq"], CPU_SHAPES["hkv"], CPU_SHAPES["d"], CPU_SHAPES["prefill"], CPU_SHAPES["batch"], CPU_SHAPES["ctx"],
                CPU_SHAPES["window"]) if cpu else Shapes()
    gpu = torch.cuda.get_device_name(dev) if not cpu else platform.processor() or "cpu"
    bench.log(f"# bench_attention on {gpu}: {versions(torch)}")
    fi, fi_backends = None, [b for b in args.fi_backends.split(",") if b]
    if not cpu and fi_backends:
        try:
            import flashinfer  # noqa: F401

            from quantkit.kernels import attention_flashinfer as fi
        except Exception as err:  # noqa: BLE001 -- logged; the rows without FlashInfer still run
            bench.log(f"FlashInfer not importable, its rows are left out: {type(err).__name__}: {err}")
    for section in (bench_prefill, bench_decode) + (() if args.no_sweep else (bench_sweep,)):
        bench.log(f"## {section.__name__} ({bench.left():.0f} s left)")
        section(bench, sh, fi, fi_backends) if section is not bench_sweep else section(bench, sh)
        if not cpu:
            torch.cuda.empty_cache()
    head = [f"## Sink attention ({time.strftime('%Y-%m-%d')}, {gpu})", "", versions(torch) + f"; Hq {sh.hq}, Hkv {sh.hkv}, D {sh.d}, pages {PAGE}; "
            f"goals: prefill within {GOALS['prefill_vs_flashinfer']}x of FlashInfer, decode >= {GOALS['decode_hbm']:.0%} of HBM {HBM_GBS / 1000} TB/s", ""]
    full = ["| section | case | backend | ms | TFLOPS | GB/s | of peak | check | note |", "|---|---|---|---|---|---|---|---|---|"]
    full += [f"| {r.section} | {r.case} | {r.backend} | {r.ms or '-'} | {r.tflops and round(r.tflops, 1)} | {r.gbs and round(r.gbs)} | "
             f"{r.peak_share and f'{r.peak_share:.1%}'} | {r.check} | {r.note} |" for r in bench.rows]
    short = summary(bench.rows)
    text = "\n".join(head + short + ["", "<details><summary>all rows</summary>", ""] + full + ["", "</details>", ""])
    (args.out / "results.md").write_text(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)
    failed = [r for r in bench.rows if r.check.startswith(("FAIL", "error"))]
    print("\n".join(["", f"{len(bench.rows)} rows, {len(failed)} failed or errored; details in {args.out}/results.md", *short]))


if __name__ == "__main__":
    main()
