"""Fused norm / activation + activation quantization: check the Triton ops against their torch
references on the GPU, then time them against the unfused path the engine would run otherwise.

    quantkit bench fused-quant --out OUT [--m 1 64 4096 16384] [--cases ...] [--sweep]
        [--append FILE] [--budget-s 300] [--device cuda|cpu]

Cases (bf16 inputs): ``rmsnorm_act_quant`` at DeepSeek-V3's hidden 7168 (fp8-block float and
ue8m0 scales, mxfp8), ``silu_mul_act_quant`` at its expert I = 2048 ([gate | up] halves of one
[M, 4096] tensor), ``swiglu_act_quant`` at GPT-OSS's I = 2880 (interleaved [M, 5760]).  Per M:

* exact: every byte of the Triton output against the torch reference on the same GPU (NaN = NaN);
* fused: the Triton op, ``triton.testing.do_bench`` median, L2 flushed before each call;
* unfused: the engine's separate op (its RMSNorm module / ``F.silu(g) * u`` / the GPT-OSS expert
  activation, torch eager) writing the bf16 activation, then the Triton act-quant kernel;
* GB/s = the fused op's bytes (input read + E4M3 and scales written, norm weight once) / its
  time, and its share of HBM (H200: 4800 GB/s); speed-up = unfused / fused.

Writes OUT/bench.log, OUT/results.jsonl (:mod:`.record`), OUT/results.md (appended to FILE with
``--append``) and prints a short table last.  ``--device cpu`` is a smoke test of this benchmark:
Triton's interpreter on shapes cut to a few rows and K = 320 / I = 160, never appended.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from dataclasses import dataclass

from .harness import Bench, bench_parser, describe, start

MS = (1, 64, 4096, 16384)


@dataclass(frozen=True)
class Case:
    name: str
    op: str
    k: int  # row length of the input (norm: K; activations: 2I)
    fmt: tuple[str, str, str]  # (fmt, scale_fmt, rule)


CASES = [
    Case("rmsnorm-fp8-block-float", "rmsnorm_act_quant", 7168, ("fp8-block", "float", "rceil")),
    Case("rmsnorm-fp8-block-ue8m0", "rmsnorm_act_quant", 7168, ("fp8-block", "ue8m0", "rceil")),
    Case("rmsnorm-mxfp8", "rmsnorm_act_quant", 7168, ("mxfp8", "float", "rceil")),
    Case("silu_mul-fp8-block-float", "silu_mul_act_quant", 4096, ("fp8-block", "float", "rceil")),
    Case("silu_mul-mxfp8", "silu_mul_act_quant", 4096, ("mxfp8", "float", "rceil")),
    Case("swiglu-fp8-block-float", "swiglu_act_quant", 5760, ("fp8-block", "float", "rceil")),
    Case("swiglu-mxfp8", "swiglu_act_quant", 5760, ("mxfp8", "float", "rceil")),
]


@dataclass
class Row:
    case: str
    m: int
    k: int
    mb: float  # MB read + written by the fused op
    exact: str = "-"
    fused_ms: float | None = None
    unfused_ms: float | None = None
    gbs: float | None = None
    hbm: float | None = None
    speedup: float | None = None


def make_args(torch, case: Case, m: int, k: int, device) -> tuple:
    """The op's positional arguments: bf16 rows whose magnitudes span 2**-8 .. 2**8."""
    g = torch.Generator(device=device).manual_seed(0)
    mag = torch.randint(-8, 9, (m, 1), device=device, generator=g).to(torch.float32).exp2()
    x = (torch.randn(m, k, device=device, generator=g) * mag).to(torch.bfloat16)
    if case.op == "rmsnorm_act_quant":
        w = (1 + 0.1 * torch.randn(k, device=device, generator=g)).to(torch.bfloat16)
        return (x, w, 1e-6, *case.fmt)
    if case.op == "silu_mul_act_quant":
        return (x[:, : k // 2], x[:, k // 2 :], *case.fmt)
    return (x, *case.fmt)


def unfused_fn(torch, case: Case, args: tuple):
    """The engine's unfused path: its torch op for the norm / activation, then the Triton act-quant."""
    import torch.nn.functional as F

    from quantkit.engine.layers.norm import RMSNorm
    from quantkit.kernels import dispatch
    from quantkit.kernels.moe.fused_moe_ref import MoeSpec, activation

    fmt, scale_fmt, rule = case.fmt

    def quant(y):
        if fmt == "fp8-block":
            return dispatch.call("act_quant_fp8_block", y, scale_fmt, rule, backend="triton")
        return dispatch.call("act_quant_mxfp8", y, rule, backend="triton")

    if case.op == "rmsnorm_act_quant":
        norm = RMSNorm(args[1], args[2])
        return lambda: quant(norm(args[0]))
    if case.op == "silu_mul_act_quant":
        return lambda: quant(F.silu(args[0]) * args[1])
    spec = MoeSpec("gpt-oss", True)
    return lambda: quant(activation(args[0][:, 0::2], args[0][:, 1::2], spec))


def fused_bytes(args: tuple, out: tuple) -> int:
    """Input tensors read once (the halves / interleaved views count once) + outputs written."""
    seen, total = set(), 0
    for t in [a for a in args if hasattr(a, "untyped_storage")] + list(out):
        key = (t.untyped_storage().data_ptr(), t.dtype)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes() if t.dim() == 2 and not t.is_contiguous() else t.numel() * t.element_size()
    return total


def exact(torch, ref: tuple, out: tuple) -> str:
    bad = n = 0
    for r, o in zip(ref, out, strict=True):
        if r.dtype == torch.float8_e4m3fn:
            rb, ob = r.view(torch.uint8), o.view(torch.uint8)
            nan = ((rb & 0x7F) == 0x7F) & ((ob & 0x7F) == 0x7F)
        elif r.dtype == torch.float32:
            rb, ob, nan = r.view(torch.int32), o.view(torch.int32), r.isnan() & o.isnan()
        else:
            rb, ob, nan = r, o, torch.zeros_like(r, dtype=torch.bool)
        bad += int(((rb != ob) & ~nan).sum())
        n += r.numel()
    return f"yes ({n})" if bad == 0 else f"NO: {bad} of {n} differ"


def run_case(b: Bench, case: Case, m: int, k: int, sweep: bool) -> Row:
    from quantkit.kernels import dispatch
    from quantkit.kernels.quant import fused_act_quant

    torch = b.torch
    args = make_args(torch, case, m, k, b.device)
    table = dispatch.REGISTRY.table(case.op)
    tri, ref_fn = table["triton"].fn, table["torch"].fn
    out = tri(*args)
    row = Row(case.name, m, k, fused_bytes(args, out) / 1e6, exact=exact(torch, ref_fn(*args), out))
    del out
    timer = b.timer.eager_ms
    row.fused_ms = timer(lambda: tri(*args))
    if sweep:
        configs = fused_act_quant.NORM_TUNING if case.op == "rmsnorm_act_quant" else fused_act_quant.ACT_TUNING
        row.fused_ms = min(timer(lambda c=c: tri(*args, **c)) for c in configs)
    row.unfused_ms = timer(unfused_fn(torch, case, args))
    row.gbs = row.mb / 1e3 / (row.fused_ms / 1e3)
    row.hbm = row.gbs / b.peaks[2]
    row.speedup = row.unfused_ms / row.fused_ms
    return row


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[Row]) -> list[str]:
    lines = ["| case | M | K (2I) | MB moved | fused ms | GB/s | % HBM | unfused ms | speed-up | bit-exact |", "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.m} | {r.k} | {r.mb:.2f} | {_f(r.fused_ms, '.4f')} | {_f(r.gbs, '.0f')} | "
            f"{_f(r.hbm and 100 * r.hbm, '.0f')} | {_f(r.unfused_ms, '.4f')} | {_f(r.speedup, '.2f')}x | {r.exact} |"
        )
    return lines


def short(rows: list[Row]) -> list[str]:
    out = [f"{'case':<26} {'M':>6} {'fused ms':>9} {'GB/s':>6} {'%HBM':>5} {'unfused':>9} {'x':>6}  exact"]
    for r in rows:
        out.append(f"{r.case:<26} {r.m:>6} {_f(r.fused_ms, '9.4f')} {_f(r.gbs, '6.0f')} {_f(r.hbm and 100 * r.hbm, '5.0f')} "
                   f"{_f(r.unfused_ms, '9.4f')} {_f(r.speedup, '6.2f')}  {r.exact[:30]}")  # fmt: skip
    return out


def write_report(b: Bench, rows: list[Row], skipped: list[str], args) -> None:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = [
        f"## Fused norm / activation + act-quant, {stamp}",
        "",
        f"Device: {b.gpu}; HBM peak used: {b.peaks[2]:g} GB/s. {describe(b.run.env)}",
        f"Command: `{b.run.command}`",
        "",
        f"- Times: median of triton.testing.do_bench (warmup {args.warmup_ms} ms, rep {args.rep_ms} ms, L2 flushed)"
        + ("; fused = the fastest launch config of the kernel's TUNING table." if args.sweep else "; default launch config."),
        "- fused: the Triton op. unfused: the engine's torch op (RMSNorm module, F.silu(g) * u, GPT-OSS expert activation) then the Triton act-quant kernel.",
        "- GB/s = (bf16 input read + E4M3 bytes and scales written, once each) / fused time; % HBM of the peak above.",
        "- bit-exact: every output byte of the Triton op against its torch reference on the same device.",
        "",
        *table(rows),
        "",
    ]
    text += [f"Skipped (time budget): {', '.join(skipped)}", ""] if skipped else []
    (args.out / "results.md").write_text("\n".join(text))
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n".join(text) + "\n")


def parse(argv: list[str]) -> argparse.Namespace:
    p = bench_parser(__name__, __doc__, budget_s=300.0, rep_ms=50, hbm=True)
    p.add_argument("--m", type=int, nargs="+", default=list(MS), help="token counts")
    p.add_argument("--cases", nargs="+", choices=[c.name for c in CASES], help="only these cases")
    p.add_argument("--sweep", action="store_true", help="time every launch config of the kernel's TUNING table, report the fastest")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    b = start(__name__, argv, args)
    cpu = not b.cuda
    log = open(args.out / "bench.log", "a")  # noqa: SIM115  (closed at the end of main)
    rows, skipped, t0 = [], [], time.monotonic()
    ms = sorted({min(m, 5) for m in args.m}) if cpu else args.m
    for case in CASES:
        if args.cases and case.name not in args.cases:
            continue
        k = 320 if cpu else case.k
        for m in ms:
            if time.monotonic() - t0 > args.budget_s:
                skipped.append(f"{case.name} M={m}")
                continue
            try:
                row = run_case(b, case, m, k, args.sweep)
            except Exception as err:  # noqa: BLE001 -- recorded in the table and the log; the run goes on
                row = Row(case.name, m, k, 0.0, exact=f"error: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
            line = short([row])[1]
            print(line, file=sys.stderr, flush=True)
            log.write(line + "\n")
            b.run.write(args.out / "results.jsonl", row, ("case", "m", "k"))
            rows.append(row)
            if not cpu:
                b.torch.cuda.empty_cache()
    log.close()
    write_report(b, rows, skipped, args)
    print("\n".join(short(rows)))
    return 0 if all(r.exact.startswith("yes") for r in rows) else 1

