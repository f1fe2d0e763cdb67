"""Fused MoE prefill tile sweep on a GPU: T tokens through GPT-OSS-120B and DeepSeek-V3 shaped
experts (the moe benchmark's random weights and routing), the table's config and each variant timed with
triton.testing.do_bench (L2 cleared before every call), each variant's output compared with the
table config's (same maths: the relative error is 0 unless the summation order changes).

    quantkit bench sweep-moe-prefill --out OUT --formats fp8-block mxfp8 --budget-s 200 [--sorted-only] [--mx-steps 64 128]

Prints one line per config: ms, TFLOPS (6 T top_k I H), the share of the device's dense FP8 TFLOPS (H200: 1979);
writes one record per config to OUT/results.jsonl (:mod:`.record`).  ``--device cpu``: Triton's interpreter
on the moe benchmark's tiny models at T = 9, one variant (64x64 tiles on expert-sorted rows).
"""

from __future__ import annotations

from .harness import Bench, bench_parser, start

VARIANTS = (  # (block_m, block_n1, block_n2, warps, stages[, group_m[, sorted rows]])
    (128, 64, 128, 8, 3, 8, True), (128, 64, 128, 8, 4, 8, True), (64, 64, 128, 4, 4, 8, True), (128, 64, 64, 8, 4, 8, True),
    (128, 32, 128, 8, 4, 8, True), (128, 64, 128, 8, 4, 16, True), (64, 64, 64, 4, 4, 8, True), (128, 64, 128, 8, 6, 8, True), (128, 128, 128, 8, 3, 8, True),
    (128, 64, 128, 8, 3), (128, 64, 128, 8, 4), (64, 64, 128, 4, 3), (64, 64, 128, 4, 4), (128, 64, 128, 8, 3, 16),
    (128, 128, 128, 8, 3), (64, 128, 128, 8, 3), (128, 64, 64, 8, 3), (64, 64, 64, 4, 3),
)  # fmt: skip


def main(argv: list[str]) -> None:
    p = bench_parser(__name__, __doc__, budget_s=200.0, rep_ms=200, append=False)
    p.set_defaults(warmup_ms=25)
    p.add_argument("--models", nargs="+", default=["gpt-oss-120b", "deepseek-v3"])
    p.add_argument("--formats", nargs="+", default=["fp8-block"], choices=["fp8-block", "mxfp8"])
    p.add_argument("--tokens", type=int, default=None, help="tokens per batch (default: 8192; 9 on the CPU)")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense FP8 TFLOPS the shares are of (default: by device name)")
    p.add_argument("--sorted-only", action="store_true", help="only the expert-sorted-row variants")
    p.add_argument("--mx-steps", type=int, nargs="*", default=[], help="MXFP8 sorted rows: also time each variant with these K steps (64, 128)")
    p.add_argument("--wgmma", action="store_true", help="FP8-block: time the warp-specialised sorted-row kernel's variants and PREFILL_TILED instead of VARIANTS")
    args = p.parse_args(argv)
    b = start(__name__, argv, args)
    from .moe import CPU_MODELS, MODELS

    models, tokens = (MODELS, args.tokens or 8192) if b.cuda else (CPU_MODELS, args.tokens or 9)
    peak = args.peak_tflops or b.peaks[0]
    for fmt in args.formats:
        for name in args.models:
            sweep_one(b, fmt, models[name], tokens, peak, args.sorted_only, tuple(args.mx_steps), args.wgmma)  # fmt: skip
            if b.cuda:
                b.torch.cuda.empty_cache()


WGMMA_VARIANTS = ((128, 5, 8), (64, 5, 8), (64, 4, 8), (64, 5, 16))  # (block_m, stages, group_m) of the warp-specialised kernel


def sweep_one(b: Bench, fmt: str, m, t: int, peak: float, sorted_only: bool = False, mx_steps: tuple = (), wgmma: bool = False) -> None:
    """One model and format: the table's config, then each of VARIANTS (``wgmma``: of WGMMA_VARIANTS) while there is time."""
    from quantkit.kernels.moe.fused_moe import MoeConfig, fused_moe
    from quantkit.kernels.moe.select import select_call
    from quantkit.kernels.moe.tables import PREFILL_TILED

    from .moe import model_experts, tokens

    torch, dev = b.torch, b.device
    out_of_time = b.out_of_time
    variants = VARIANTS if b.cuda else VARIANTS[6:7]  # on the interpreter: the smallest expert-sorted tiles
    ex = model_experts(torch, fmt, m, dev)
    spec, w13, w2 = ex.spec, ex.w13, ex.w2
    x, wts, ids = tokens(torch, ex, t, dev)
    flops = 6 * t * m.top_k * m.inter * m.h

    def run(cfg) -> torch.Tensor:
        return fused_moe(x, wts, ids, w13, w2, spec, config=cfg)

    def timed(cfg) -> float:
        return b.timer.eager_ms(lambda: run(cfg))

    def record(cfg, ms: float | None, err: float | None, note: str = "") -> None:
        rates = {"tflops": flops / ms / 1e9, "peak_share": flops / ms / 1e9 / peak, "x_table": tb / ms} if ms else {}
        row = {"format": fmt, "model": m.name, "tokens": t, "config": cfg.name(), "ms": ms, **rates, "rel_err_vs_table": err, "note": note}
        b.run.write(b.out / "results.jsonl", row, ("format", "model", "tokens", "config"))

    base = select_call(x, wts, ids, w13, w2, spec).config
    ref = run(base).float()
    tb = timed(base)
    record(base, tb, 0.0, "table")
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
            record(cfg, tv, err)
            print(f"   {cfg.name():28s} {tv:.3f} ms {flops / tv / 1e9:5.0f} TFLOPS ({flops / tv / 1e9 / peak:.0%}) x{tb / tv:.2f} the table, rel err vs table {err:.1e}", flush=True)
        return
    steps = (32, *mx_steps) if fmt == "mxfp8" else (32,)
    for v, step in ((v, step) for v in variants for step in steps):
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
            record(cfg, tv, err)
            print(f"   {cfg.name():28s} {tv:.3f} ms {flops / tv / 1e9:5.0f} TFLOPS x{tb / tv:.2f} the table, rel err vs table {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001  (a config that fails to compile is reported, the sweep goes on)
            record(cfg, None, None, f"FAIL {type(e).__name__}: {str(e)[:150]}")
            print(f"   {cfg.name()} FAIL {str(e)[:150]}", flush=True)
