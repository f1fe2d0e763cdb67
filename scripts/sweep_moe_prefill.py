"""Fused MoE prefill tile sweep on a GPU: T tokens through GPT-OSS-120B and DeepSeek-V3 shaped
experts (bench_moe's random weights and routing), the table's config and each variant timed with
triton.testing.do_bench (L2 cleared before every call), each variant's output compared with the
table config's (same maths: the relative error is 0 unless the summation order changes).

    python scripts/sweep_moe_prefill.py --formats fp8-block mxfp8 --budget-s 200 [--sorted-only] [--mx-steps 64 128]

Prints one line per config: ms, TFLOPS (6 T top_k I H), the share of the H200's 1979 dense FP8 TFLOPS.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

VARIANTS = (  # (block_m, block_n1, block_n2, warps, stages[, group_m[, sorted rows]])
    (128, 64, 128, 8, 3, 8, True), (128, 64, 128, 8, 4, 8, True), (64, 64, 128, 4, 4, 8, True), (128, 64, 64, 8, 4, 8, True),
    (128, 32, 128, 8, 4, 8, True), (128, 64, 128, 8, 4, 16, True), (64, 64, 64, 4, 4, 8, True), (128, 64, 128, 8, 6, 8, True), (128, 128, 128, 8, 3, 8, True),
    (128, 64, 128, 8, 3), (128, 64, 128, 8, 4), (64, 64, 128, 4, 3), (64, 64, 128, 4, 4), (128, 64, 128, 8, 3, 16),
    (128, 128, 128, 8, 3), (64, 128, 128, 8, 3), (128, 64, 64, 8, 3), (64, 64, 64, 4, 3),
)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gpt-oss-120b", "deepseek-v3"])
    p.add_argument("--formats", nargs="+", default=["fp8-block"], choices=["fp8-block", "mxfp8"])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--budget-s", type=float, default=200.0, help="no new config starts after this")
    p.add_argument("--peak-tflops", type=float, default=1979.0)
    p.add_argument("--sorted-only", action="store_true", help="only the expert-sorted-row variants")
    p.add_argument("--mx-steps", type=int, nargs="*", default=[], help="MXFP8 sorted rows: also time each variant with these K steps (64, 128)")
    p.add_argument("--wgmma", action="store_true", help="FP8-block: time the warp-specialised sorted-row kernel's variants and PREFILL_TILED instead of VARIANTS")
    args = p.parse_args()

    import torch
    from bench_moe import MODELS

    t0 = time.time()
    for fmt in args.formats:
        for name in args.models:
            sweep_one(fmt, MODELS[name], args.tokens, args.peak_tflops, lambda: time.time() - t0 > args.budget_s, args.sorted_only, tuple(args.mx_steps),
                      args.wgmma)  # fmt: skip
            torch.cuda.empty_cache()


WGMMA_VARIANTS = ((128, 5, 8), (64, 5, 8), (64, 4, 8), (64, 5, 16))  # (block_m, stages, group_m) of the warp-specialised kernel


def sweep_one(fmt: str, m, t: int, peak: float, out_of_time, sorted_only: bool = False, mx_steps: tuple = (), wgmma: bool = False) -> None:
    """One model and format: the table's config, then each of VARIANTS (``wgmma``: of WGMMA_VARIANTS) while there is time."""
    import torch
    import triton
    from bench_moe import model_experts, tokens

    from quantkit.kernels.moe.fused_moe import MoeConfig, fused_moe
    from quantkit.kernels.moe.select import select_call
    from quantkit.kernels.moe.tables import PREFILL_TILED

    dev = torch.device("cuda")
    ex = model_experts(torch, fmt, m, dev)
    spec, w13, w2 = ex.spec, ex.w13, ex.w2
    x, wts, ids = tokens(torch, ex, t, dev)
    flops = 6 * t * m.top_k * m.inter * m.h

    def run(cfg) -> torch.Tensor:
        return fused_moe(x, wts, ids, w13, w2, spec, config=cfg)

    def timed(cfg) -> float:
        return triton.testing.do_bench(lambda: run(cfg), warmup=25, rep=200)

    base = select_call(x, wts, ids, w13, w2, spec).config
    ref = run(base).float()
    tb = timed(base)
    print(f"== {fmt} {m.name} T={t}: table {base.name()} {tb:.3f} ms {flops / tb / 1e9:.0f} TFLOPS ({flops / tb / 1e9 / peak:.0%} of peak)", flush=True)
    if wgmma and fmt == "fp8-block":  # the warp-specialised kernel takes FP8-block experts only
        cands = [MoeConfig(bm, 64, 128, num_stages=st, group_m=g, sorted_rows=True, wgmma=True) for bm, st, g in WGMMA_VARIANTS]
        cands.append(PREFILL_TILED)  # the Triton sorted-row kernel the table falls back to
        for cfg in cands:
            if out_of_time():
                print("   budget spent", flush=True)
                return
            err = ((run(cfg).float() - ref).norm() / ref.norm()).item()
            tv = timed(cfg)
            print(f"   {cfg.name():28s} {tv:.3f} ms {flops / tv / 1e9:5.0f} TFLOPS ({flops / tv / 1e9 / peak:.0%}) x{tb / tv:.2f} the table, rel err vs table {err:.1e}", flush=True)
        return
    steps = (32, *mx_steps) if fmt == "mxfp8" else (32,)
    for v, step in ((v, step) for v in VARIANTS for step in steps):
        if out_of_time():
            print("   budget spent", flush=True)
            return
        sorted_rows = len(v) > 6 and v[6]
        if (sorted_only and not sorted_rows) or (step != 32 and not sorted_rows):
            continue
        cfg = MoeConfig(*v[:3], num_warps=v[3], num_stages=v[4], group_m=v[5] if len(v) > 5 else 8, upcast=base.upcast and v[0] >= 64,
                        sorted_rows=sorted_rows, mx_step=step)  # fmt: skip
        try:
            err = ((run(cfg).float() - ref).norm() / ref.norm()).item()
            tv = timed(cfg)
            print(f"   {cfg.name():28s} {tv:.3f} ms {flops / tv / 1e9:5.0f} TFLOPS x{tb / tv:.2f} the table, rel err vs table {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001  (a config that fails to compile is reported, the sweep goes on)
            print(f"   {cfg.name()} FAIL {str(e)[:150]}", flush=True)

if __name__ == "__main__":
    main()
