"""Sweep the paged sink-attention decode kernel's launch configuration (block_n, warps, stages) and
explicit split counts over (batch, context) cases, on bench_attention's decode inputs (Hq 64, Hkv 8,
D 64, shuffled 16-token pages, bf16), each result checked against the float32 reference.

Timing: a CUDA graph of ``--calls`` back-to-back calls, replayed 15 times after an L2 flush, median
per call.  Calls after the first in a replay may read K/V left in L2 (50 MB on the H200), so use
it to rank configurations; ``bench_attention.py`` gives the figures (every call flushed).
Writes OUT/decode_sweep.json; prints the default and the best per case.

    python scripts/sweep_decode.py --out OUT [--budget-s 420]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_attention import PAGE, Shapes, decode_check, decode_inputs  # noqa: E402  (same inputs and reference)

CASES = ((1, 1024), (1, 4096), (1, 16384), (1, 32768), (2, 8192), (4, 4096), (8, 1024), (8, 4096), (8, 16384), (8, 32768),
         (16, 2048), (16, 8192), (32, 1024), (32, 4096), (32, 16384), (64, 1024), (64, 4096))  # fmt: skip
TILES = ((64, 4, 3), (64, 4, 2), (128, 4, 3), (128, 4, 2), (64, 2, 2), (32, 2, 3))  # (block_n, warps, stages)
SPLITS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # 0: the config's own rule
HBM_BYTES_S = 4.8e12


def graph_ms(torch, fn, calls: int) -> float:
    """Median ms per call of a graph of ``calls`` calls, each replay after an L2 flush."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    times = []
    for _ in range(15):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def sweep_case(torch, trid, sh: Shapes, b: int, ctx: int, calls: int, deadline: float) -> list[dict]:
    kc, vc, bt, lens, q, sinks = decode_inputs(torch, torch.device("cuda"), sh, b, ctx)
    scale = sh.d**-0.5
    check = decode_check(torch, q, kc, vc, bt, ctx, sinks, None, scale)
    rows = []
    for (bn, warps, stages), splits in itertools.product(TILES, SPLITS):
        if time.time() > deadline or splits > -(-ctx // bn):
            continue
        cfg = trid.DecodeConfig(bn, warps, stages, num_splits=splits)
        run = lambda cfg=cfg: trid.attention_decode(q, kc, vc, bt, lens, PAGE, scale, sinks, None, config=cfg)  # noqa: E731
        verdict = check(run())
        ms = graph_ms(torch, run, calls)
        used = trid.choose(q, kc, vc, bt, lens, PAGE, scale, sinks, None, config=cfg).config.num_splits
        hbm = 2.0 * b * ctx * sh.hkv * 2 * sh.d / (ms * 1e-3) / HBM_BYTES_S
        rows.append({"b": b, "ctx": ctx, "cfg": cfg.name(), "splits": used, "ms": ms, "hbm": hbm, "check": verdict})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=420.0, help="start no new configuration after this many seconds")
    p.add_argument("--calls", type=int, default=20, help="calls per graph replay")
    args = p.parse_args()
    import torch

    from quantkit.kernels.attention import decode as trid

    args.out.mkdir(parents=True, exist_ok=True)
    deadline, rows, default = time.time() + args.budget_s, [], trid.DecodeConfig().name()
    for b, ctx in CASES:
        case = sweep_case(torch, trid, Shapes(), b, ctx, args.calls, deadline)
        if not case:
            continue
        rows += case
        best = min(case, key=lambda r: r["ms"])
        mine = [r for r in case if r["cfg"] == default]
        failed = sum(not r["check"].startswith("ok") for r in case)
        print(f"B={b:<3} ctx={ctx:<6} default {mine[0]['ms'] * 1e3 if mine else float('nan'):7.1f} us  best {best['ms'] * 1e3:7.1f} us "
              f"{best['hbm']:.0%} {best['cfg']} ({best['splits']} splits)  failed checks {failed}/{len(case)}", flush=True)  # fmt: skip
    (args.out / "decode_sweep.json").write_text(json.dumps(rows, indent=0))


if __name__ == "__main__":
    main()
