"""Sweep the paged sink-attention decode kernel's launch configuration (block_n, warps, stages) and
explicit split counts over (batch, context) cases, on the attention benchmark's decode inputs (Hq 64, Hkv 8,
D 64, shuffled 16-token pages, bf16), each result checked against the float32 reference.

Timing: the attention benchmark's graph time (:meth:`.timer.Timer.graph_ms`: each call in a CUDA graph after
an L2 flush, minus a flush-only graph).  Writes OUT/results.jsonl (one record per configuration,
:mod:`.record`); prints the default and the best per case.  ``--device cpu``: Triton's interpreter on the
attention benchmark's CPU shapes, one case, two tiles, two split counts, wall-clock timing.

    quantkit bench sweep-decode --out OUT [--budget-s 420]
"""

from __future__ import annotations

import itertools

from .attention import CPU_SHAPES, PAGE, Shapes, decode_check, decode_inputs  # same inputs and reference
from .harness import Bench, bench_parser, start

CASES = ((1, 1024), (1, 4096), (1, 16384), (1, 32768), (2, 8192), (4, 4096), (8, 1024), (8, 4096), (8, 16384), (8, 32768),
         (16, 2048), (16, 8192), (32, 1024), (32, 4096), (32, 16384), (64, 1024), (64, 4096))  # fmt: skip
TILES = ((64, 4, 3), (64, 4, 2), (128, 4, 3), (128, 4, 2), (64, 2, 2), (32, 2, 3))  # (block_n, warps, stages)
SPLITS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # 0: the config's own rule


def sweep_case(bench: Bench, trid, sh: Shapes, b: int, ctx: int, tiles: tuple, splits_: tuple) -> list[dict]:
    torch = bench.torch
    kc, vc, bt, lens, q, sinks = decode_inputs(torch, bench.device, sh, b, ctx)
    scale = sh.d**-0.5
    check = decode_check(torch, q, kc, vc, bt, ctx, sinks, None, scale)
    rows = []
    for (bn, warps, stages), splits in itertools.product(tiles, splits_):
        if bench.out_of_time() or splits > -(-ctx // bn):
            continue
        cfg = trid.DecodeConfig(bn, warps, stages, num_splits=splits)
        run = lambda cfg=cfg: trid.attention_decode(q, kc, vc, bt, lens, PAGE, scale, sinks, None, config=cfg)  # noqa: E731
        verdict = check(run())
        ms = bench.graph_ms(run, None) if bench.cuda else bench.time_ms(run)
        used = trid.choose(q, kc, vc, bt, lens, PAGE, scale, sinks, None, config=cfg).config.num_splits
        hbm = 2.0 * b * ctx * sh.hkv * 2 * sh.d / (ms * 1e-3) / (bench.peaks[2] * 1e9) if ms else None
        row = {"b": b, "ctx": ctx, "cfg": cfg.name(), "splits": used, "ms": ms, "hbm": hbm, "check": verdict}
        bench.run.write(bench.out / "results.jsonl", row, ("b", "ctx", "cfg"))
        rows.append(row)
    return rows


def main(argv: list[str]) -> None:
    p = bench_parser(__name__, __doc__, budget_s=420.0, rep_ms=20, append=False)
    args = p.parse_args(argv)
    bench = start(__name__, argv, args)
    from quantkit.kernels.attention import decode as trid

    default = trid.DecodeConfig().name()
    sh, cases, tiles, splits = (Shapes(), CASES, TILES, SPLITS) if bench.cuda else (Shapes(**CPU_SHAPES), ((1, 80),), TILES[:2], SPLITS[:2])
    for b, ctx in cases:
        case = [r for r in sweep_case(bench, trid, sh, b, ctx, tiles, splits) if r["ms"]]
        if not case:
            continue
        best = min(case, key=lambda r: r["ms"])
        mine = [r for r in case if r["cfg"] == default]
        failed = sum(not r["check"].startswith("ok") for r in case)
        print(f"B={b:<3} ctx={ctx:<6} default {mine[0]['ms'] * 1e3 if mine else float('nan'):7.1f} us  best {best['ms'] * 1e3:7.1f} us "
              f"{best['hbm']:.0%} {best['cfg']} ({best['splits']} splits)  failed checks {failed}/{len(case)}", flush=True)  # fmt: skip
