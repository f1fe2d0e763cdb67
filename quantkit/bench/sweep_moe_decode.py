"""Sweep the fused MoE's decode tile configs on served models' expert shapes (GPT-OSS-20B: 32 experts,
top-4, H = I = 2880; Qwen3-30B-A3B: 128 experts, top-8, H 2048, I 768), at the token counts of a decode
batch, FP8-block experts; each config checked against the torch reference first (``moe.moe_check``).

Timing: ``timer.Timer.graph_ms`` (a CUDA graph of calls, each after an L2 flush: the experts come from
HBM, as in a served step).  Writes OUT/bench.log and OUT/results.jsonl (one record per config, :mod:`.record`);
prints the table config and the best per (model, T) last.  ``--device cpu``: Triton's interpreter on a tiny
GPT-OSS-shaped model at T = 1 and 9 (or ``--tokens``), the table's config and one candidate.

    quantkit bench sweep-moe-decode --out OUT [--models gpt-oss-20b qwen3-30b-a3b] [--tokens 1 8 32 64 128 256]
"""

from __future__ import annotations

from .harness import bench_parser, fmt, start
from .moe import Model, hit_bytes, model_experts, moe_check, tokens

MODELS = {
    "gpt-oss-20b": Model("gpt-oss-20b", 32, 2880, 2880, 4, "topk_softmax", "gpt-oss"),
    "qwen3-30b-a3b": Model("qwen3-30b-a3b", 128, 2048, 768, 8, "softmax_topk", "silu", (("norm_topk_prob", True),)),
}
CPU_MODELS = {"gpt-oss-20b": Model("gpt-oss-20b", 8, 160, 128, 4, "topk_softmax", "gpt-oss")}
# (block_m, block_n1, block_n2, warps, stages, block_k, pdl); the table's own config is timed first
CANDIDATES = (
    (16, 32, 64, 4, 4, 128, True), (16, 32, 64, 4, 3, 256, True), (16, 64, 64, 4, 3, 256, False), (16, 64, 128, 4, 3, 256, True),
    (16, 32, 32, 4, 5, 128, True), (16, 64, 64, 4, 4, 128, True), (32, 64, 64, 4, 4, 128, False), (32, 64, 64, 4, 3, 256, True),
    (32, 32, 64, 4, 4, 128, True), (64, 64, 128, 4, 3, 128, False), (64, 64, 64, 4, 4, 128, True), (64, 32, 64, 4, 4, 128, True),
    (32, 128, 128, 8, 3, 128, False), (64, 128, 128, 8, 3, 128, False),
)  # fmt: skip


def main(argv: list[str]) -> None:
    p = bench_parser(__name__, __doc__, budget_s=300.0, rep_ms=20, append=False)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--tokens", nargs="+", type=int, help="token counts (default: 1 8 32 64 128 256; 1 9 on the CPU)")
    args = p.parse_args(argv)
    b = start(__name__, argv, args)
    torch, device, peaks = b.torch, b.device, b.peaks
    from quantkit.kernels.moe.fused_moe import MoeConfig, fused_moe
    from quantkit.kernels.moe.select import select_call
    from quantkit.kernels.moe.fused_moe_ref import fused_moe_ref

    b.log(f"sweep-moe-decode: {b.gpu} {b.run.env}")
    models = MODELS if b.cuda else CPU_MODELS
    ts = args.tokens or ([1, 8, 32, 64, 128, 256] if b.cuda else [1, 9])
    cands = CANDIDATES if b.cuda else CANDIDATES[:1]
    result: dict[str, dict] = {}
    for name in args.models:
        if name not in models:
            continue
        m = models[name]
        ex = model_experts(torch, "fp8-block", m, device)
        for t in ts:
            x, wts, ids = tokens(torch, ex, t, device)
            ref = fused_moe_ref(x, wts, ids, ex.w13, ex.w2, ex.spec)
            nbytes = hit_bytes(torch, ids, ex.w13, ex.w2) + 4.0 * t * m.h
            flops = 2.0 * t * m.top_k * 3 * m.h * m.inter
            table = select_call(x, wts, ids, ex.w13, ex.w2, ex.spec).config
            cfgs = [("table " + table.name(), table)]
            cfgs += [(c.name(), c) for c in (MoeConfig(*v[:5], block_k=v[5], pdl=v[6]) for v in cands) if c != table]
            rows = []
            for label, cfg in cfgs:
                if b.out_of_time():
                    b.skipped.append(f"{name} T={t} {label}")
                    continue
                r = b.measure("moe-sweep", name, (t, m.h, m.inter), label,
                              lambda cfg=cfg: fused_moe(x, wts, ids, ex.w13, ex.w2, ex.spec, config=cfg), flops, nbytes, peaks[0], moe_check(torch, ref))  # fmt: skip
                rows.append(r)
            ok = [r for r in rows if r.check.startswith("ok") and r.t]
            if ok:
                best, tab = min(ok, key=lambda r: r.t), rows[0]
                result[f"{name} T={t}"] = {"table": tab.backend, "table_ms": tab.t, "best": best.backend, "best_ms": best.t,
                                            "floor_ms": nbytes / (peaks[2] * 1e9) * 1e3, "all": {r.backend: r.t for r in rows}}  # fmt: skip
        del ex
    b.log("\n| case | table | ms | best | ms | floor ms | table/best |\n|---|---|---|---|---|---|---|")
    for case, r in result.items():
        b.log(f"| {case} | {r['table']} | {fmt(r['table_ms'])} | {r['best']} | {fmt(r['best_ms'])} | {fmt(r['floor_ms'])} | {r['table_ms'] / r['best_ms']:.2f} |")
    if b.skipped:
        b.log(f"skipped (budget): {len(b.skipped)}")

