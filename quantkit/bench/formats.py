"""Format-conversion kernels: check each Triton kernel against the quantkit.formats reference on
full-size tensors, then time it and the reference on the same device.

    quantkit bench formats --out OUT [--append FILE] [--quick] [--sweep]
        [--ops mxfp4_decode ...] [--budget-s 480] [--device cuda|cpu]

Per case: the Triton backend runs once on the whole tensor (compiles) and its bytes are compared
with the torch reference run on the same device in chunks of leading-dim slices (at most
CHUNK_ELEMS elements each, stochastic offsets carried, so memory stays bounded), all chunks,
bit for bit (NaN matches NaN).  Then ``triton.testing.do_bench`` (median, L2 flushed before each
call) times the kernel on the whole tensor and the reference on its first chunk; the reference
time is scaled to the whole tensor by element count.  GB/s counts bytes read + written once;
"% HBM" divides by the device's peak (H200: 4.8 TB/s).  Goal: every bandwidth-bound case
>= 60% of HBM and >= 5x the reference.  ``--sweep`` also times every launch configuration in
the kernel module's TUNING table and names the fastest.

Writes OUT/bench.log, OUT/results.jsonl (one record per case, :mod:`.record`) and OUT/results.md (the section that
``--append FILE`` adds to FILE, with device, versions, shapes and the command); prints
a short table last.  ``--device cpu`` is a smoke test of this benchmark: Triton's interpreter on
shapes cut to a few rows, wall-clock timing, never appended.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .harness import Bench, bench_parser, describe, start

GOAL_HBM, GOAL_SPEEDUP = 0.60, 5.0
CHUNK_ELEMS = 1 << 27  # reference chunk: ~134M elements, a few GB of temporaries


@dataclass(frozen=True)
class Case:
    op: str  # dispatcher op
    name: str
    shape: tuple[int, ...]  # logical [..., N, K] of the unpacked tensor
    opts: tuple = ()  # positional options after the tensor(s), as the reference takes them
    bandwidth: bool = True  # False: latency-bound size, reported but not held to the goals


def _cases() -> list[Case]:
    from quantkit.formats.rounding import Rounding

    sr = Rounding("stochastic", seed=0, name="model.layers.0.mlp.experts.gate_up_proj")
    up, down, ds = (128, 5760, 2880), (128, 2880, 2880), (32, 4096, 7168)
    return [
        Case("mxfp4_decode", "gpt-oss-120b gate_up -> bf16", up),
        Case("mxfp4_decode", "gpt-oss-120b down -> bf16", down),
        Case("fp8_block_quantize_weight", "gpt-oss-120b gate_up float", up, ("float", "rceil")),
        Case("fp8_block_quantize_weight", "gpt-oss-120b gate_up ue8m0", up, ("ue8m0", "rceil")),
        Case("fp8_block_quantize_weight", "gpt-oss-120b gate_up float stochastic", up, ("float", "rceil", sr)),
        Case("fp8_block_quantize_weight", "deepseek-v3 32 experts gate_up float", ds, ("float", "rceil")),
        Case("mxfp8_quantize", "gpt-oss-120b gate_up rceil", up, ("rceil",)),
        Case("mxfp8_quantize", "gpt-oss-120b gate_up rceil stochastic", up, ("rceil", sr)),
        Case("act_quant_fp8_block", "prefill 16384 tok x 7168 float", (16384, 7168), ("float",)),
        Case("act_quant_fp8_block", "prefill 16384 tok x 7168 ue8m0", (16384, 7168), ("ue8m0",)),
        Case("act_quant_mxfp8", "prefill 16384 tok x 7168", (16384, 7168)),
        Case("act_quant_fp8_block", "decode 64 tok x 7168", (64, 7168), ("float",), bandwidth=False),
        Case("act_quant_mxfp8", "decode 64 tok x 2880", (64, 2880), bandwidth=False),
    ]


def scaled(shape: tuple[int, ...], quick: bool, cpu: bool) -> tuple[int, ...]:
    """--quick: 16 experts / 4096 tokens; cpu: a few rows, K cut to 160 (partial 128-tile, K % 32 == 0)."""
    if cpu:
        return (*(min(d, 2) for d in shape[:-2]), min(shape[-2], 130), min(shape[-1], 160))
    if quick and len(shape) == 3:
        return (min(shape[0], 16), *shape[1:])
    if quick and shape[0] > 4096:
        return (4096, *shape[1:])
    return shape


@dataclass
class Row:
    op: str
    case: str
    shape: list[int]
    mb: float  # MB read + written
    triton_ms: float | None = None
    gbs: float | None = None
    hbm: float | None = None
    torch_ms: float | None = None  # whole tensor, scaled from the first chunk
    speedup: float | None = None
    exact: str = "-"  # "yes (N elements)", "NO: ...", "error: ..."
    goal: str = "-"
    config: str = ""
    sweep: dict = field(default_factory=dict)


# ---- inputs, bytes, reference chunks ------------------------------------------------------------


def make_inputs(b: Bench, case: Case, shape: tuple[int, ...]) -> tuple:
    """Tensors the op takes, on the device: MXFP4 blocks/scales, else bf16 values whose rows
    span 2**-10 .. 2**10 in magnitude (so tiles and groups get many different scales)."""
    torch = b.torch
    g = torch.Generator(device=b.device).manual_seed(0)
    if case.op == "mxfp4_decode":
        *lead, n, k = shape
        blocks = torch.randint(0, 256, (*lead, n, k // 32, 16), dtype=torch.uint8, device=b.device, generator=g)  # [E, N, G, 16]
        scales = torch.randint(117, 131, (*lead, n, k // 32), dtype=torch.uint8, device=b.device, generator=g)  # [E, N, G]
        return blocks, scales, torch.bfloat16
    x = torch.randn(shape, dtype=torch.bfloat16, device=b.device, generator=g)
    mag = torch.randint(-10, 11, (*shape[:-1], 1), device=b.device, generator=g).to(torch.float32).exp2()
    return (x.mul_(mag.to(torch.bfloat16)), *case.opts)


def moved_bytes(args: tuple, out) -> int:
    tensors = [a for a in args if hasattr(a, "element_size")] + list(out if isinstance(out, tuple) else (out,))
    return sum(t.numel() * t.element_size() for t in tensors)


def chunk_args(args: tuple, lo: int, hi: int) -> tuple:
    """The op's arguments restricted to leading-dim rows [lo, hi): tensors sliced, a stochastic
    rounding moved to the chunk's first flat element."""
    from quantkit.formats.rounding import Rounding

    per_row = args[0][0].numel()
    return tuple(a[lo:hi] if hasattr(a, "dim") else a.at(lo * per_row) if isinstance(a, Rounding) else a for a in args)


def row_chunks(x, tile_rows: int) -> list[tuple[int, int]]:
    """Leading-dim slices of at most CHUNK_ELEMS elements (a multiple of ``tile_rows`` rows)."""
    step = max(1, CHUNK_ELEMS // max(1, x[0].numel()))
    step = max(tile_rows, step // tile_rows * tile_rows)
    return [(lo, min(lo + step, x.shape[0])) for lo in range(0, x.shape[0], step)]


def tile_rows(op: str, x) -> int:
    """Rows of one scale row: a 2D fp8-block weight has one per 128 rows, everything else one per row."""
    return 128 if op == "fp8_block_quantize_weight" and x.dim() == 2 else 1


def mismatches(ref, out) -> int:
    """Elements whose stored bits differ (any NaN equals any NaN)."""
    import torch

    if ref.dtype == torch.uint8:  # E8M0 scale bytes: 0xFF is their NaN, compared as a byte
        return int((ref != out).sum())
    if ref.dtype == torch.float8_e4m3fn:
        rb, ob = ref.view(torch.uint8), out.view(torch.uint8)
        both_nan = ((rb & 0x7F) == 0x7F) & ((ob & 0x7F) == 0x7F)
    else:
        ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[ref.dtype]
        rb, ob, both_nan = ref.view(ints), out.view(ints), ref.isnan() & out.isnan()
    return int(((rb != ob) & ~both_nan).sum())


def check(op: str, ref_fn: Callable, args: tuple, out) -> str:
    """Compare the whole Triton output with the reference, run chunk by chunk."""
    outs = out if isinstance(out, tuple) else (out,)
    tr = tile_rows(op, args[0])
    bad, n = 0, 0
    for lo, hi in row_chunks(args[0], tr):
        ref = ref_fn(*chunk_args(args, lo, hi))
        for i, (r, o) in enumerate(zip(ref if isinstance(ref, tuple) else (ref,), outs, strict=True)):
            part = o[lo // tr : -(-hi // tr)] if i == 1 else o[lo:hi]
            if r.shape != part.shape:
                return f"NO: chunk [{lo}:{hi}] output {i} has shape {tuple(r.shape)} in the reference, {tuple(part.shape)} here"
            bad += mismatches(r, part)
            n += r.numel()
        del ref
    return f"yes ({n} values)" if bad == 0 else f"NO: {bad} of {n} differ"


# ---- one case -------------------------------------------------------------------------------------


def run_case(b: Bench, case: Case, shape: tuple[int, ...], sweep: bool) -> Row:
    from quantkit.kernels import dispatch

    table = dispatch.REGISTRY.table(case.op)
    tri, ref_fn = table["triton"].fn, table["torch"].fn
    args = make_inputs(b, case, shape)
    out = tri(*args)
    row = Row(case.op, case.name, list(shape), moved_bytes(args, out) / 1e6)
    row.exact = check(case.op, ref_fn, args, out)
    del out
    row.triton_ms = b.time_ms(lambda: tri(*args))
    lo, hi = row_chunks(args[0], tile_rows(case.op, args[0]))[0]
    part = chunk_args(args, lo, hi)
    row.torch_ms = b.time_ms(lambda: ref_fn(*part)) * args[0].shape[0] / (hi - lo)
    row.gbs = row.mb / 1e3 / (row.triton_ms / 1e3)
    row.hbm = row.gbs / b.peaks[2]
    row.speedup = row.torch_ms / row.triton_ms
    if sweep:
        for cfg in tuning(case.op):
            row.sweep[json.dumps(cfg)] = b.time_ms(lambda cfg=cfg: tri(*args, **cfg))
        row.config = min(row.sweep, key=row.sweep.get)
    ok = row.hbm >= GOAL_HBM and row.speedup >= GOAL_SPEEDUP and row.exact.startswith("yes")
    row.goal = ("met" if ok else "missed") if case.bandwidth else "n/a (latency-bound)"
    return row


def tuning(op: str) -> tuple[dict, ...]:
    from quantkit.kernels.quant import fp8_block_quant, group_quant, mxfp4_decode

    return {
        "mxfp4_decode": mxfp4_decode.TUNING,
        "fp8_block_quantize_weight": fp8_block_quant.TUNING + fp8_block_quant.SR_TUNING,
        "mxfp8_quantize": group_quant.MX_TUNING,
        "act_quant_mxfp8": group_quant.MX_TUNING,
        "act_quant_fp8_block": group_quant.ACT_TUNING,
    }[op]


# ---- report -----------------------------------------------------------------------------------


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(rows: list[Row], sweep: bool) -> list[str]:
    head = "| op | case | shape | MB moved | Triton ms | GB/s | % HBM | torch ms | speedup | bit-exact | goal |"
    head += " fastest config (ms) |" if sweep else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cfg = f" {r.config} ({_f(r.sweep.get(r.config), '.3f')}) |" if sweep else ""
        lines.append(
            f"| {r.op} | {r.case} | {'x'.join(map(str, r.shape))} | {r.mb:.0f} | {_f(r.triton_ms, '.3f')} | {_f(r.gbs, '.0f')} | "
            f"{_f(r.hbm and r.hbm * 100, '.0f')} | {_f(r.torch_ms, '.2f')} | {_f(r.speedup, '.1f')}x | {r.exact} | {r.goal} |{cfg}"
        )
    return lines


def write_report(b: Bench, rows: list[Row], skipped: list[str], args: argparse.Namespace) -> list[str]:
    from quantkit.kernels.triton_numerics import hw_e4m3

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    met = [r for r in rows if r.goal == "met"]
    held = [r for r in rows if r.goal in ("met", "missed")]
    text = [
        f"## Format-conversion kernels, {stamp}",
        "",
        f"Device: {b.gpu}; HBM peak used: {b.peaks[2]:g} GB/s. " + describe(b.run.env),
        f"Command: `{b.run.command}`",
        "",
        f"- Times: median of triton.testing.do_bench (warmup {b.timer.warmup_ms} ms, rep {b.timer.rep_ms} ms, L2 flushed). "
        "Triton on the whole tensor; the torch reference (quantkit.formats, same device) on its first chunk of "
        f"<= {CHUNK_ELEMS} elements, scaled to the whole tensor by element count.",
        "- GB/s = (bytes read + bytes written, once each) / Triton time. Inputs bf16 (MXFP4: random codes, scale bytes 117..130).",
        f"- E4M3 rounding: {'hardware cast (cvt.rn.satfinite.e4m3x2.f32); stochastic: carry-add on the float32 bits, then the same cast' if hw_e4m3(b.device) else 'assembled byte (nearest and stochastic)'}.",
        "- bit-exact: every output byte of the Triton run compared with the reference run chunk by chunk.",
        f"- Goal per bandwidth-bound case: >= {GOAL_HBM:.0%} of HBM and >= {GOAL_SPEEDUP:g}x the reference: met {len(met)}/{len(held)}.",
        "",
        *table(rows, args.sweep),
        "",
    ]
    text += [f"Skipped (time budget): {', '.join(skipped)}", ""] if skipped else []
    (b.out / "results.md").write_text("\n".join(text))
    if args.append:
        path = Path(args.append)
        if not path.exists():
            path.write_text("# Benchmarks\n\nMeasured figures, newest last; each section is one run of `quantkit bench`.\n\n")
        with open(path, "a") as f:
            f.write("\n".join(text) + "\n")
    return text


def short(rows: list[Row]) -> list[str]:
    out = [f"{'op':<26} {'case':<40} {'ms':>8} {'GB/s':>6} {'%HBM':>5} {'xTorch':>7}  exact  goal"]
    for r in rows:
        ex = "yes" if r.exact.startswith("yes") else r.exact[:40]
        hbm = _f(r.hbm and 100 * r.hbm, "5.0f")
        out.append(
            f"{r.op:<26} {r.case[:40]:<40} {_f(r.triton_ms, '8.3f')} {_f(r.gbs, '6.0f')} {hbm} {_f(r.speedup, '7.1f')}  {ex}  {r.goal}"
        )
    return out


# ---- driver ---------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    p = bench_parser(__name__, __doc__, budget_s=480.0, rep_ms=50, hbm=True)
    p.add_argument("--ops", nargs="+", help="only these ops")
    p.add_argument("--quick", action="store_true", help="16 experts / 4096 tokens instead of the full sizes")
    p.add_argument("--sweep", action="store_true", help="also time each launch configuration of the kernel's TUNING table")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    b = start(__name__, argv, args)
    b.log(f"formats: {b.gpu}, HBM {b.peaks[2]:g} GB/s, torch {b.torch.__version__}")
    rows, skipped, t0 = [], [], time.monotonic()
    for case in _cases():
        if args.ops and case.op not in args.ops:
            continue
        shape = scaled(case.shape, args.quick, args.device == "cpu")
        if time.monotonic() - t0 > args.budget_s:
            skipped.append(f"{case.op} {case.name}")
            continue
        b.log(f"== {case.op}: {case.name} {list(shape)}")
        try:
            row = run_case(b, case, shape, args.sweep)
        except Exception as err:  # noqa: BLE001 -- recorded in the table and the log; the run goes on
            row = Row(case.op, case.name, list(shape), 0.0, exact=f"error: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
        b.log("   " + short([row])[1])
        rows.append(row)
        b.run.write(args.out / "results.jsonl", row, ("op", "case", "shape"))
        if b.cuda:
            b.torch.cuda.empty_cache()
    write_report(b, rows, skipped, args)
    b.log(f"\n==== {time.monotonic() - t0:.0f} s; report in {args.out / 'results.md'} ====")
    print("\n".join(short(rows)))
    failed = [r for r in rows if not r.exact.startswith("yes")]
    return 1 if failed else 0

