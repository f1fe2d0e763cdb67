"""Sink attention benchmark (GPT-OSS: 64 q / 8 kv heads, head_dim 64, sinks, window 128).

    quantkit bench attention --out OUT [--budget-s 240] [--fi-backends auto] [--no-sweep]
        [--append FILE] [--device cuda|cpu]

Timing, logging and result rows are :mod:`.harness`'s (``Bench``: do_bench median with L2
flushed before every call, so the KV cache comes from HBM; decode also replayed from a CUDA graph,
each call after a flush that reads 256 MB and leaves the L2 clean: how decode is served).  Every
backend is first checked against the float32 torch reference on the benchmark's own inputs (a slice
of queries / two sequences; |err| <= 1e-2 + 1e-2 |ref|), then timed:

* prefill, 8192 tokens in one sequence and a ragged batch of ~8k tokens, window 128 and full:
  Triton (ragged k/v, and the 16-token paged cache), FlashInfer's sink variant (ragged, and its
  ``BatchAttentionWithAttentionSinkWrapper`` on the paged cache), torch SDPA without sinks
  (flash for full causal, a boolean mask for the window; a per-sequence loop for ragged);
  TFLOPS = 4 * Hq * D * (visible query-key pairs) / time, against the dense bf16 peak.
* decode over the paged cache (16-token pages), batch 1..64 x context 1k..32k: Triton,
  FlashInfer (planned once, ``run`` timed), SDPA on a contiguous cache without sinks;
  GB/s = K+V bytes the step must read / time, against HBM bandwidth (goal >= 60 %).
* then, while the budget lasts, Triton launch configurations at two decode points and on the
  8192-token prefills (the rows of quantkit/kernels/attention/tables.py come from here).

FlashInfer runs when ``import flashinfer`` works (its wheel on PYTHONPATH); its first use
JIT-compiles one module per window setting (~40 s each).  ``--device cpu`` is a smoke test of
this benchmark: Triton's interpreter on tiny shapes.  Writes OUT/bench.log as it goes,
OUT/results.jsonl (one record per timing, :mod:`.record`), OUT/results.md; prints the short table last.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from .harness import Bench, bench_parser, best_row, describe, fmt, rows_table, lazy, load_flashinfer, pct, Row, start  # timers, rows, log

HQ, HKV, D, WINDOW, PAGE = 64, 8, 64, 128, 16
PREFILL = {"single": [8192], "ragged": [3000, 2048, 1500, 1000, 500, 100, 33, 1]}
DECODE_BATCH, DECODE_CTX = (1, 8, 32, 64), (1024, 4096, 16384, 32768)
GOALS = {"prefill_vs_flashinfer": 1.3, "decode_hbm": 0.60}
CPU_SHAPES = dict(hq=4, hkv=2, d=16, prefill={"single": [64], "ragged": [40, 17, 5]}, batch=(1, 3), ctx=(32, 80), window=8)


def left(b: Bench) -> float:
    return b.deadline - time.monotonic()


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


def prefill_reference(torch, q, k, v, lens, sinks, window, scale):
    """float32 reference on the first and last 32 queries of each sequence: (out rows [n, Hq, D], their row indices)."""
    from quantkit.kernels.attention.attention_ref import attend

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


def bench_prefill(b: Bench, sh: Shapes, fi, fi_backends: list[str]) -> None:
    torch = b.torch
    from quantkit.kernels.attention import prefill as tri

    g, scale, bf16, peak = torch.Generator().manual_seed(0), sh.d**-0.5, torch.bfloat16, b.peaks[1]
    for name, lens in sh.prefill.items():
        t = sum(lens)
        q, k, v = (torch.randn(t, h, sh.d, generator=g).to(bf16).to(b.device) for h in (sh.hq, sh.hkv, sh.hkv))
        sinks = (torch.randn(sh.hq, generator=g) * 2).to(b.device)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=b.device)
        kc, vc, bt = to_pages(torch, k, v, lens, g)
        lens_t = torch.tensor(lens, dtype=torch.int32, device=b.device)
        for window in (None, sh.window):
            case = f"{name} {t} {'swa' + str(window) if window else 'full'}"
            want, rows = prefill_reference(torch, q, k, v, lens, sinks, window, scale)
            check = (lambda w, r: lambda out: closeness(w)(out[r]))(want, rows)
            flops = 4.0 * sh.hq * sh.d * pairs(lens, window)
            mk = dict(flops=flops, nbytes=0.0, peak_tflops=peak, check=check, graph=False)
            shape = (t, max(lens), sh.d)
            b.measure("prefill", case, shape, "triton", lambda: tri.attention_prefill(q, k, v, cu, cu, scale, sinks, window, max_seqlen_q=max(lens)), **mk)
            b.measure("prefill", case, shape, "triton paged16",
                      lambda: tri.attention_prefill(q, kc, vc, cu, cu, scale, sinks, window, bt, PAGE, max(lens)), **mk)
            for fb in fi_backends if fi else ():
                def ragged(fb=fb, window=window):
                    a = fi.SinkAttention(b.device, bf16, sh.hq, sh.hkv, sh.d, scale=scale, window=window, backend=fb)
                    a.plan_ragged(cu, cu)
                    return lambda: a.run(q, k, v, sinks)

                def paged(fb=fb, window=window):
                    a = fi.SinkAttention(b.device, bf16, sh.hq, sh.hkv, sh.d, scale=scale, window=window, backend=fb)
                    a.plan_paged(cu, bt, lens_t, PAGE)
                    return lambda: a.run(q, kc, vc, sinks)

                b.measure("prefill", case, shape, f"flashinfer-{fb}", lazy(ragged), **mk, note="ragged, sink variant")
                b.measure("prefill", case, shape, f"flashinfer-{fb} paged16", lazy(paged), **mk, note="SinkWrapper")
            b.measure("prefill", case, shape, "torch sdpa", sdpa_prefill(torch, q, k, v, lens, window, scale), flops, 0.0, peak, None,
                      note="no sinks", graph=False)
        q = k = v = kc = vc = None  # free the case's tensors (rebound, not deleted: the timed lambdas close over these names)


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
    from quantkit.kernels.attention.attention_ref import attend, paged_rows

    sel = sorted({0, q.shape[0] - 1})
    want = []
    for b in sel:
        r = paged_rows(bt, b, ctx, PAGE)
        pos = torch.arange(ctx, device=q.device)
        want.append(attend(q[b : b + 1].float(), kc[r].float(), vc[r].float(), pos[-1:], pos, scale, sinks, window))
    ref = torch.cat(want)
    return lambda out: closeness(ref)(out[sel])


def bench_decode(b: Bench, sh: Shapes, fi, fi_backends: list[str]) -> None:
    torch = b.torch
    import torch.nn.functional as F

    from quantkit.kernels.attention import decode as tri

    scale = sh.d**-0.5
    cases = [(n, c, None) for n in sh.batch for c in sh.ctx] + [(sh.batch[0], sh.ctx[-1], sh.window), (sh.batch[-1], sh.ctx[-1], sh.window)]
    for n, ctx, window in cases:
        if left(b) < 30:
            b.skipped.append(f"decode B={n} ctx={ctx}")
            continue
        kc, vc, bt, lens, q, sinks = decode_inputs(torch, b.device, sh, n, ctx)
        case = f"B={n} ctx={ctx}" + (f" swa{window}" if window else "")
        keys = min(ctx, window or ctx)
        mk = dict(flops=4.0 * n * sh.hq * sh.d * keys, nbytes=2.0 * n * keys * sh.hkv * 2 * sh.d, peak_tflops=b.peaks[1],  # bf16 K and V rows read
                  check=decode_check(torch, q, kc, vc, bt, ctx, sinks, window, scale))
        b.measure("decode", case, (n, ctx, sh.d), "triton", lambda: tri.attention_decode(q, kc, vc, bt, lens, PAGE, scale, sinks, window), **mk)
        for fb in fi_backends if fi else ():
            def planned(fb=fb, window=window):
                a = fi.SinkAttention(b.device, torch.bfloat16, sh.hq, sh.hkv, sh.d, scale=scale, window=window, backend=fb)
                a.plan_paged(torch.arange(n + 1, dtype=torch.int32, device=b.device), bt, lens, PAGE)
                return lambda: a.run(q, kc, vc, sinks)

            b.measure("decode", case, (n, ctx, sh.d), f"flashinfer-{fb}", lazy(planned), **mk, note="SinkWrapper")
        if window is None:
            kk, vv = (torch.randn(n, sh.hkv, ctx, sh.d, device=b.device, dtype=torch.bfloat16) for _ in range(2))
            q4 = q[:, :, None, :]
            b.measure("decode", case, (n, ctx, sh.d), "torch sdpa", lambda: F.scaled_dot_product_attention(q4, kk, vv, scale=scale, enable_gqa=True),
                      **{**mk, "check": None}, note="contiguous, no sinks")
            del kk, vv
        kc = vc = None  # free the cache (rebound: the timed lambdas close over these names)


PREFILL_SWEEP = ((128, 64, 4, 3), (128, 64, 4, 2), (128, 64, 4, 4), (128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4),
                 (128, 32, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 3), (128, 128, 4, 2), (256, 64, 8, 2), (256, 128, 8, 2))
DECODE_SWEEP = ((64, 4, 3), (32, 4, 3), (128, 4, 3), (128, 8, 3), (64, 4, 2), (64, 4, 4), (256, 8, 3), (128, 4, 4), (32, 2, 4))


def bench_sweep(b: Bench, sh: Shapes, parts: list[str]) -> None:
    """Triton launch configurations: decode (block_n, warps, stages) first (quicker to compile),
    then prefill (block_m, block_n, warps, stages), until the budget runs out."""
    torch = b.torch
    from quantkit.kernels.attention import prefill as tri
    from quantkit.kernels.attention import decode as trid

    scale = sh.d**-0.5
    for n, ctx in ((sh.batch[0], sh.ctx[-1]), (sh.batch[-1], sh.ctx[1])) if "decode" in parts else ():
        kc, vc, bt, lens, q, sinks = decode_inputs(torch, b.device, sh, n, ctx)
        check = decode_check(torch, q, kc, vc, bt, ctx, sinks, None, scale)
        for cfg in (trid.DecodeConfig(*c) for c in DECODE_SWEEP):
            if left(b) < 10:
                return b.skipped.append("rest of the sweep")
            run = (lambda c: lambda: trid.attention_decode(q, kc, vc, bt, lens, PAGE, scale, sinks, config=c))(cfg)
            b.measure("decode", f"B={n} ctx={ctx}", (n, ctx, sh.d), f"triton {cfg.name()}", run, 4.0 * n * sh.hq * sh.d * ctx,
                      2.0 * n * ctx * sh.hkv * 2 * sh.d, b.peaks[1], check, note="sweep")
        kc = vc = None  # free the cache (rebound: the timed lambdas close over these names)
    if "prefill" not in parts:
        return
    g, n = torch.Generator().manual_seed(1), sh.prefill["single"][0]
    q, k, v = (torch.randn(n, h, sh.d, generator=g).to(torch.bfloat16).to(b.device) for h in (sh.hq, sh.hkv, sh.hkv))
    sinks = torch.randn(sh.hq, generator=g).to(b.device)
    cu = torch.tensor([0, n], dtype=torch.int32, device=b.device)
    for window in (None, sh.window):
        want, rows = prefill_reference(torch, q, k, v, [n], sinks, window, scale)
        flops, check = 4.0 * sh.hq * sh.d * pairs([n], window), (lambda w, r: lambda out: closeness(w)(out[r]))(want, rows)
        for cfg in (tri.PrefillConfig(*c) for c in PREFILL_SWEEP):
            if left(b) < 15:
                return b.skipped.append("rest of the sweep")
            run = (lambda c, w: lambda: tri.attention_prefill(q, k, v, cu, cu, scale, sinks, w, max_seqlen_q=n, config=c))(cfg, window)
            case = f"single {n} {'swa' + str(window) if window else 'full'}"
            b.measure("prefill", case, (n, n, sh.d), f"triton {cfg.name()}", run, flops, 0.0, b.peaks[1], check, note="sweep", graph=False)


def summary(rows: list[Row]) -> list[str]:
    """The short table: Triton (defaults) against the best FlashInfer row and SDPA per case; the best sweep config."""
    pick = partial(best_row, rows)

    out = ["| case | triton ms | triton | roofline | flashinfer ms (best) | triton / flashinfer | goal | sdpa ms | best sweep config |",
           "|---|---|---|---|---|---|---|---|---|"]
    for case in dict.fromkeys(r.case for r in rows if r.note != "sweep"):
        tri, fi = pick(case, lambda n: n == "triton"), pick(case, lambda n: n.startswith("flashinfer"))
        sd, best = pick(case, lambda n: n == "torch sdpa"), pick(case, lambda n: True, sweep=True)
        if tri is None:
            out.append(f"| {case} | error | | | | | | | |")
            continue
        rate = f"{fmt(tri.tflops, 0)} TFLOPS" if tri.family == "prefill" else f"{fmt(tri.gbs, 0)} GB/s"
        if tri.family == "prefill":
            goal = "-" if fi is None else ("met" if tri.t / fi.t <= GOALS["prefill_vs_flashinfer"] else "missed")
        else:
            goal = "met" if (tri.roofline or 0) >= GOALS["decode_hbm"] else "missed"
        fi_s = f"{fmt(fi.t)} ({fi.backend})" if fi else "-"
        best_s = f"{best.backend.removeprefix('triton ')} {fmt(best.t)} ms" if best else "-"
        out.append(f"| {case} | {fmt(tri.t)} | {rate} | {pct(tri.roofline)} | {fi_s} | {fmt(tri.t / fi.t, 2) if fi else '-'} | {goal} | "
                   f"{fmt(sd.t) if sd else '-'} | {best_s} |")
    return out


def write_report(b: Bench, sh: Shapes, append: str | None) -> list[str]:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    short = summary(b.rows)
    full = rows_table(b.rows, with_family=True)
    text = [f"## Sink attention, {stamp}", "", f"Device: {b.gpu}; " + describe(b.run.env),
            f"Command: `{b.run.command}`.",
            f"Shapes: Hq {sh.hq}, Hkv {sh.hkv}, D {sh.d}, pages of {PAGE}; goals: prefill within {GOALS['prefill_vs_flashinfer']}x of "
            f"FlashInfer, decode >= {GOALS['decode_hbm']:.0%} of HBM on the K/V bytes. Times: graph where measured, else eager.", "",
            *short, "", *([f"Skipped (out of time): {', '.join(b.skipped)}", ""] if b.skipped else []),
            "<details><summary>all rows</summary>", "", *full, "", "</details>", ""]
    (b.out / "results.md").write_text("\n".join(text))
    if append:
        with open(append, "a") as f:
            f.write("\n" + "\n".join(text))
    return short


def main(argv: list[str]) -> None:
    p = bench_parser(__name__, __doc__, budget_s=240.0, rep_ms=40)
    p.add_argument("--fi-backends", default="auto", help="comma list of FlashInfer backends (auto, fa2, fa3); '' for none")
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--parts", nargs="+", choices=("prefill", "decode"), default=["prefill", "decode"], help="which ops to time (and sweep)")
    args = p.parse_args(argv)
    b = start(__name__, argv, args)
    for name in ("bench.log", "results.jsonl"):
        (args.out / name).unlink(missing_ok=True)
    sh = Shapes(**CPU_SHAPES) if b.device.type == "cpu" else Shapes()
    fi, fi_backends = load_flashinfer(b.cuda, args.fi_backends, b.run.env, "attention.flashinfer")
    b.log(f"attention: {b.gpu} {b.run.env}")
    t0 = time.monotonic()
    for section in (bench_prefill, bench_decode):
        if section.__name__.removeprefix("bench_") in args.parts:
            b.log(f"## {section.__name__} ({left(b):.0f} s left)")
            section(b, sh, fi, fi_backends)
    if args.sweep:
        b.log(f"## sweep ({left(b):.0f} s left)")
        bench_sweep(b, sh, args.parts)
    short = write_report(b, sh, args.append)
    failed = [r for r in b.rows if r.check.startswith(("FAIL", "error"))]
    b.log(f"\n==== sink attention ({time.monotonic() - t0:.0f} s, {len(b.rows)} rows, {len(failed)} failed checks or errors; "
          f"full report {args.out / 'results.md'}) ====")
    for line in short:
        b.log(line)

