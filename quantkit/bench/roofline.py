"""Roofline plot of benchmark rows: achieved TFLOPS against arithmetic intensity (FLOP per HBM
byte), log-log, under the device's roofs (HBM bandwidth, dense FP8 and BF16 peaks).

    quantkit bench roofline OUT/gemm/results.jsonl OUT/moe/results.jsonl [--out docs/roofline.png]
        [--hbm-gbs 4800] [--fp8-tflops 1979] [--bf16-tflops 989] [--title "..."]

Reads the ``results.jsonl`` that the kernels, moe, attention and mla benchmarks write (one record of a
:class:`.harness.Row` per line, :mod:`.record`; the flat rows written before the records are read too); a row
is plotted when it has a rate (TFLOPS and GB/s: the CUDA-graph time where there was one).  Intensity = TFLOPS / GB/s x 1000.  One marker per
(family, backend); matplotlib is imported here only (the ``eval`` / ``test`` extras carry it).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from .record import flat, read

MARKERS = "osD^v<>pPX*hH"


def load_points(paths: list[Path]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """{(family, backend): [(FLOP per byte, TFLOPS)]} of the rows that carry a rate."""
    points: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for path in paths:
        try:
            rows = [flat(r) for r in read(path)]
        except ValueError as err:
            raise SystemExit(str(err)) from err
        for row in rows:
            tflops, gbs = row.get("tflops"), row.get("gbs")
            if not tflops or not gbs or tflops <= 0 or gbs <= 0:
                continue
            points[(row.get("family", "?"), row.get("backend", "?"))].append((tflops * 1e3 / gbs, tflops))
    return dict(points)


def plot(points: dict[tuple[str, str], list[tuple[float, float]]], out: Path, hbm_gbs: float, fp8: float, bf16: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [x for pts in points.values() for x, _ in pts]
    lo, hi = min(xs + [1.0]) / 2, max(xs + [fp8 * 1e3 / hbm_gbs]) * 2
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    for peak, name in ((fp8, "FP8 dense"), (bf16, "BF16 dense")):
        knee = peak * 1e3 / hbm_gbs  # FLOP per byte where the bandwidth roof meets the compute one
        ax.plot([lo, knee, hi], [lo * hbm_gbs / 1e3, peak, peak], lw=1.2, ls="-" if name.startswith("FP8") else "--", color="0.3")
        ax.annotate(f"{name} {peak:.0f} TFLOPS", (hi, peak), ha="right", va="bottom", fontsize=8, color="0.3")
    ax.annotate(f"HBM {hbm_gbs / 1e3:.1f} TB/s", (lo * 1.3, lo * 1.3 * hbm_gbs / 1e3), rotation=33, fontsize=8, color="0.3")
    for i, ((family, backend), pts) in enumerate(sorted(points.items())):
        ax.scatter([x for x, _ in pts], [y for _, y in pts], s=18, marker=MARKERS[i % len(MARKERS)], label=f"{family}: {backend} ({len(pts)})", alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("achieved TFLOPS")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str]) -> None:
    from . import prog

    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="results.jsonl files of the benchmarks")
    p.add_argument("--out", type=Path, default=Path("roofline.png"))
    p.add_argument("--hbm-gbs", type=float, default=4800.0)
    p.add_argument("--fp8-tflops", type=float, default=1979.0)
    p.add_argument("--bf16-tflops", type=float, default=989.0)
    p.add_argument("--title", default="H200 roofline: quantkit kernels and baselines")
    args = p.parse_args(argv)
    missing = [str(r) for r in args.results if not r.is_file()]
    if missing:
        raise SystemExit(f"roofline: no such results file: {', '.join(missing)}")
    points = load_points(args.results)
    if not points:
        raise SystemExit("roofline: no row with a rate (TFLOPS and GB/s) in " + ", ".join(map(str, args.results)))
    plot(points, args.out, args.hbm_gbs, args.fp8_tflops, args.bf16_tflops, args.title)
    print(f"roofline: {sum(map(len, points.values()))} points in {len(points)} series -> {args.out}")

