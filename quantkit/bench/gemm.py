"""GEMM family of ``quantkit bench kernels``: FP8-block (Triton, cuBLAS, auto) and MXFP8 paths
against the bf16 matmul, on the served models' projection shapes; then a config sweep.

Main pass, per (shape, M): bf16 matmul; cuBLAS block-scaled ``scaled_mm`` on prepared operands;
the Triton leaf the selection picks; ``auto`` through the dispatcher, on activation scales
written MN-major as the engine's quantizers write them on a GPU (per-call layout work included);
DeepGEMM on prepared operands; the MXFP8 paths (emulated, dequant-bf16).  Sweep: candidate
configs per M on :data:`TUNE_SHAPES` (graph timing only), ranked by geomean time, printed as
config-table rows.  Shapes, M values and goals are data below.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from .gemm_candidates import mx_candidates, persistent_candidates, skinny_candidates, tiled_candidates
from .harness import Bench, Row, close_check, fmt, geomean, pct

GEMM_SHAPES: tuple[tuple[str, str, int, int], ...] = (  # (model, projection, N, K)
    ("gpt-oss", "qkv", 5120, 2880),
    ("gpt-oss", "o", 2880, 4096),
    ("gpt-oss", "expert gate_up", 5760, 2880),
    ("gpt-oss", "expert down", 2880, 2880),
    ("deepseek-v3", "q_a+kv_a", 2112, 7168),
    ("deepseek-v3", "q_b", 24576, 1536),
    ("deepseek-v3", "kv_b", 32768, 512),
    ("deepseek-v3", "o", 7168, 16384),
    ("deepseek-v3", "expert gate_up", 4096, 7168),
    ("deepseek-v3", "expert down", 7168, 2048),
    ("qwen3-235b", "qkv", 9216, 4096),
    ("qwen3-235b", "o", 4096, 8192),
    ("qwen3-235b", "expert gate_up", 3072, 4096),
    ("qwen3-235b", "expert down", 4096, 1536),
)
GEMM_MS = (1, 16, 64, 128, 1024, 4096, 8192)
SWEEP_MS_QUICK = (1, 16, 64, 128, 1024, 8192)
GEMM_TOL = 1e-3  # same fp8 inputs and f32 promotion; the fp8 tensor core keeps ~14 bits within each scale block
TUNE_SHAPES = (("deepseek-v3", "o"), ("deepseek-v3", "expert gate_up"), ("qwen3-235b", "qkv"), ("gpt-oss", "expert gate_up"))
MX_TUNE_SHAPES = (("deepseek-v3", "expert gate_up"), ("gpt-oss", "expert gate_up"))
GOALS = {"large_m": 1024, "vs_cublas_large": 1.0, "small_m": 64, "vs_cublas_small": 1.5, "decode_bw": 0.70, "decode_weight_mb": 30, "mx_vs_fp8": 0.8}
MX_PATHS = ("mx", "mx-bf16")


def gemm_bytes(m: int, n: int, k: int, kind: str) -> float:
    """HBM bytes a GEMM must move: operands, scales, bf16 output."""
    kb, nb = -(-k // 128), -(-n // 128)
    if kind == "bf16":
        return 2.0 * (m * k + n * k + m * n)
    scales = 4.0 * (m * kb + nb * kb) if kind == "fp8-block" else (m + n) * k / 32
    return m * k + n * k + 2.0 * m * n + scales


# ---- operands -------------------------------------------------------------------------------


def gemm_weights(b: Bench, n: int, k: int) -> dict:
    """Every layout of one random weight [N, K] (std 0.02): fp8-block (float scales), MXFP8 (exact
    from power-of-two fp8-block), bf16, and cuBLAS's and DeepGEMM's layouts."""
    torch = b.torch
    from quantkit.formats import exact, fp8_block
    from quantkit.kernels.gemm import deepgemm, scaled_mm

    w = torch.randn(n, k, device=b.device) * 0.02
    q, sw = fp8_block.quantize_weight(w)
    qp, swp = fp8_block.quantize_weight(w, "ue8m0")
    qm, sm = exact.fp8_block_pow2_to_mxfp8(qp, swp)
    cw = scaled_mm.prepare_weight(q, sw) if scaled_mm.cublas_available(b.device).ok else None
    dw = deepgemm.prepare_weight(q, sw) if deepgemm.available(b.device).ok and n % 8 == 0 else None
    return {"q": q, "sw": sw, "qm": qm, "sm": sm, "wb": w.to(torch.bfloat16), "cw": cw, "dw": dw}


def gemm_acts(b: Bench, m: int, n: int, k: int, wt: dict) -> dict:
    """Activations [M, K] in both formats and the float32 references of both functions."""
    torch = b.torch
    from quantkit.formats import fp8_block, mxfp8
    from quantkit.kernels.gemm import gemm_ref

    x = torch.randn(m, k, device=b.device)
    a, sa = fp8_block.quantize_act(x)
    am, sam = mxfp8.quantize(x)
    ref8 = gemm_ref.gemm_fp8_block_ref(a, sa, wt["q"], wt["sw"], None, torch.float32)
    refmx = gemm_ref.gemm_mxfp8_ref(am, sam, wt["qm"], wt["sm"], None, torch.float32)
    return {"a": a, "sa": sa, "am": am, "sam": sam, "xb": x.to(torch.bfloat16), "ref8": ref8, "refmx": refmx}


def cublas_probe(b: Bench) -> None:
    """Which M cuBLASLt's block-scaled FP8 GEMM accepts unpadded (the first run saw M = 1 refused)."""
    torch = b.torch
    from quantkit.formats import fp8_block
    from quantkit.kernels.gemm import scaled_mm as sm
    from quantkit.kernels.gemm.gemm_ref import gemm_fp8_block_ref

    q, sw = fp8_block.quantize_weight(torch.randn(256, 512, device=b.device) * 0.02)
    cw = sm.prepare_weight(q, sw)
    ok, refused = [], []
    for m in (1, 2, 3, 4, 5, 8, 12, 16, 24):
        a, sa = fp8_block.quantize_act(torch.randn(m, 512, device=b.device))
        ap, sac = sm.prepare_act(a, sa, 512, m_align=1)
        try:
            y = sm.scaled_mm_prepared(ap, sac, cw, None, torch.bfloat16)
            verdict = close_check(gemm_fp8_block_ref(a, sa, q, sw, None, torch.float32), GEMM_TOL)(y)
        except RuntimeError as err:
            verdict = f"error {str(err).splitlines()[0][:60]}"
        (ok if verdict.startswith("ok") else refused).append(m if verdict.startswith(("ok", "error")) else f"{m} ({verdict})")
    line = f"cuBLASLt block-scaled FP8 probe (N=256, K=512, M unpadded): runs M in {ok}, refuses {refused}; quantkit pads M to a multiple of CUBLAS_M_ALIGN={sm.CUBLAS_M_ALIGN}."
    b.log("  " + line)
    b.notes.append(line)


# ---- passes ---------------------------------------------------------------------------------


def gemm_one(b: Bench, case: str, m: int, n: int, k: int, wt: dict) -> None:
    """Main pass at one (shape, M): baselines, the selected Triton leaf, auto, the MXFP8 paths."""
    torch = b.torch
    from quantkit.formats import fp8_block
    from quantkit.kernels import dispatch
    from quantkit.kernels.gemm import scaled_mm
    from quantkit.kernels.gemm import mxfp8 as gmx

    x = gemm_acts(b, m, n, k, wt)
    a, sa, am, sam = x["a"], x["sa"], x["am"], x["sam"]
    fp8_peak, bf16_peak, _ = b.peaks
    flops, mnk, fam = 2.0 * m * n * k, (m, n, k), "gemm"
    b8, bmx = gemm_bytes(m, n, k, "fp8-block"), gemm_bytes(m, n, k, "mxfp8")
    c8, cmx = close_check(x["ref8"], GEMM_TOL), close_check(x["refmx"], GEMM_TOL)
    b.measure(fam, case, mnk, "bf16", lambda: torch.matmul(x["xb"], wt["wb"].t()), flops, gemm_bytes(m, n, k, "bf16"), bf16_peak, None)
    if wt["cw"] is not None:
        ap, sa_c = scaled_mm.prepare_act(a, sa, wt["cw"].mat_b.shape[0])
        pad = f"M padded to {ap.shape[0]}" if ap.shape[0] != m else ""
        b.measure(fam, case, mnk, "cublas", lambda: scaled_mm.scaled_mm_prepared(ap, sa_c, wt["cw"], None, torch.bfloat16)[:m], flops, b8, fp8_peak, c8, pad, host=True)
        sa_mn = fp8_block.act_scales_mn(sa)  # as the engine's quantizers write them on a GPU (scale_mn)
        b.measure(fam, case, mnk, "auto", lambda: dispatch.call("gemm_fp8_block", a, sa_mn, wt["q"], wt["sw"]),
                  flops, b8, fp8_peak, c8, f"{dispatch.choose('gemm_fp8_block', a, sa_mn, wt['q'], wt['sw'])}, scales MN-major", host=True)  # fmt: skip
    if wt["dw"] is not None:
        from quantkit.kernels.gemm import deepgemm

        ad, sad = deepgemm.prepare_act(a, sa)
        note = deepgemm.launch_config(m, n, k, b.device).name()  # the config gemm_prepared picks, as auto's launches do
        b.measure(fam, case, mnk, "deepgemm", lambda: deepgemm.gemm_prepared(ad, sad, wt["dw"]), flops, b8, fp8_peak, c8, note, host=True)
    c = dispatch.choose("gemm_fp8_block", a, sa, wt["q"], wt["sw"], backend="triton")
    b.measure(fam, case, mnk, "triton", lambda: c.run(a, sa, wt["q"], wt["sw"]), flops, b8, fp8_peak, c8, str(c), host=True)
    cm = dispatch.choose("gemm_mxfp8", am, sam, wt["qm"], wt["sm"], backend="triton")
    mx_calls = {
        "mx": (lambda: cm.run(am, sam, wt["qm"], wt["sm"]), str(cm)),
        "mx-bf16": (lambda: gmx.gemm_mxfp8_bf16(am, sam, wt["qm"], wt["sm"]), "dequant to bf16 + cuBLAS bf16 GEMM, f32 out"),
    }
    for path, (fn, note) in mx_calls.items():
        b.measure(fam, case, mnk, path, fn, flops, bmx, fp8_peak, cmx, note)


def gemm_configs(b: Bench, case: str, m: int, n: int, k: int, wt: dict, cands: list[tuple[str, object]], label: str) -> None:
    """Time candidate (path, config) launches at one (shape, M), graph timing only, each checked."""
    from quantkit.kernels.gemm import fp8_block as g8
    from quantkit.kernels.gemm import mxfp8 as gmx

    x = gemm_acts(b, m, n, k, wt)
    run = {
        "fp8": (lambda c: g8.gemm_fp8_block(x["a"], x["sa"], wt["q"], wt["sw"], config=c), "fp8-block", "ref8"),
        "mx": (lambda c: gmx.gemm_mxfp8(x["am"], x["sam"], wt["qm"], wt["sm"], config=c), "mxfp8", "refmx"),
    }
    for path, c in cands:
        if b.out_of_time():
            b.skipped.append(f"gemm {label} {case} M={m} {c.name()} (time budget)")
            continue
        fn, kind, ref = run[path]
        b.measure("gemm", case, (m, n, k), f"{label}{'' if path == 'fp8' else '-' + path} {c.name()}", lambda fn=fn, c=c: fn(c),
                  2.0 * m * n * k, gemm_bytes(m, n, k, kind), b.peaks[0], close_check(x[ref], GEMM_TOL), repr(c), eager=not b.cuda)  # fmt: skip


def gemm_bias_check(b: Bench, case: str, n: int, k: int, wt: dict) -> None:
    """The epilogue bias, once per shape, at M = 1 (small-M kernel, split-K) and M = 200 (tiles)."""
    torch = b.torch
    from quantkit.formats import fp8_block
    from quantkit.kernels import dispatch
    from quantkit.kernels.gemm.gemm_ref import gemm_fp8_block_ref

    bias = torch.randn(n, device=b.device).to(torch.bfloat16)
    for m in (1, 200):
        a, sa = fp8_block.quantize_act(torch.randn(m, k, device=b.device))
        ref = gemm_fp8_block_ref(a, sa, wt["q"], wt["sw"], bias, torch.float32)
        verdict = close_check(ref, GEMM_TOL)(dispatch.call("gemm_fp8_block", a, sa, wt["q"], wt["sw"], bias, backend="triton"))
        b.add(Row("gemm", case, m, n, k, "triton+bias", None, None, None, None, None, None, verdict, "check only"))
        b.log(f"  {case:<26} M={m:<5} triton+bias    {verdict}")


def _shapes(args: argparse.Namespace, cuda: bool) -> tuple[list, list[int]]:
    shapes = [s for s in GEMM_SHAPES if not args.shapes or any(f in f"{s[0]} {s[1]}" for f in args.shapes)]
    ms = list(args.ms or GEMM_MS)
    if not cuda:  # interpreter smoke run: 32x smaller shapes that keep K % 128 != 0 and partial tiles
        shapes = [(mo, p, max(48, n // 32), max(64, k // 32 // 32 * 32)) for mo, p, n, k in shapes[:3]]
        ms = [m for m in ms if m <= 16]
    return shapes, ms


def _sweep_plan(args: argparse.Namespace, shapes: list, ms: list[int], cuda: bool) -> list[tuple[str, tuple, list[int], Callable]]:
    """(label, shape, Ms, candidates(M)) in order of value: decode, prefill, MXFP8, then persistent tiles."""
    if args.sweep == "off":
        return []
    if not cuda:  # smoke: two candidates per kind on the first shape
        return [("tune", shapes[0], ms, lambda m: [("fp8", c) for c in skinny_candidates(m)[:2]]),
                ("tune", shapes[0], ms, lambda m: [("fp8", c) for c in tiled_candidates(m)[:1]])]  # fmt: skip
    tune = shapes if args.sweep == "full" else [s for s in shapes if s[:2] in TUNE_SHAPES]
    mx_tune = shapes if args.sweep == "full" else [s for s in shapes if s[:2] in MX_TUNE_SHAPES]
    sweep_ms = ms if args.sweep == "full" else [m for m in ms if m in SWEEP_MS_QUICK]
    small, large = [m for m in sweep_ms if m <= 64], [m for m in sweep_ms if m > 64]
    plan = [("tune", s, small, lambda m: [("fp8", c) for c in skinny_candidates(m)]) for s in tune]
    plan += [("tune", s, sorted(large, reverse=True), lambda m: [("fp8", c) for c in tiled_candidates(m)]) for s in tune]
    plan += [("tune", s, [m for m in (16, 4096) if m in ms], mx_candidates) for s in mx_tune]
    plan += [("tune", s, [m for m in large if m >= 1024], lambda m: [("fp8", c) for c in persistent_candidates(m)]) for s in tune]
    return plan


def deepgemm_prebuild(b: Bench, shapes: list, ms: list[int]) -> None:
    """Compile every DeepGEMM kernel the main pass will time, 16 at a time (about 4 s each)."""
    from quantkit.kernels.gemm import deepgemm

    av = deepgemm.available(b.device)
    if not av.ok:
        b.notes.append(f"deepgemm: not run ({av.reason}).")
        return
    jobs = {(n, k, deepgemm.launch_config(m, n, k, b.device)) for _, _, n, k in shapes for m in ms if n % 8 == 0}
    t0 = time.perf_counter()
    errors = deepgemm.prebuild(jobs, 16)
    b.log(f"  deepgemm: {len(jobs)} kernels built in {time.perf_counter() - t0:.1f} s ({len(errors)} failed: {[e[:300] for e in errors[:2]]})")
    b.notes.append(
        f"deepgemm: DeepGEMM's fp8_gemm_kernel from FlashInfer's copy ({deepgemm.include_dir()}), compiled by nvcc per (N, K, tiles) "
        "with DeepGEMM's own tile/stage/multicast choice; operands prepared outside the timing as for cuBLAS (activation scales MN-major "
        "[K/128, M rounded up to 4]; a K that is not a multiple of 128 is zero-filled by TMA past its end, no copy)."
    )


def bench_gemm(b: Bench, args: argparse.Namespace, checkpoint: Callable[[], object]) -> None:
    from quantkit.kernels.gemm import scaled_mm

    shapes, ms = _shapes(args, b.cuda)
    b.notes += [
        "bf16 baseline: torch.matmul(x_bf16 [M, K], W_bf16 [N, K].t()) (cuBLAS).",
        f"cuBLAS baseline: {scaled_mm.api()} with ScalingType.BlockWise1x128 / BlockWise128x128 on prepared operands "
        "(layout work not timed): W [N, K] passed as W.t() (column-major, no copy), K zero-padded to a multiple of 128 "
        "(2880 -> 2944, so cuBLAS does 2.2% more work there; TFLOPS use the true K), scale_a column-major [M', K/128], "
        f"M' = M rounded up to {scaled_mm.CUBLAS_M_ALIGN} with zero rows (cuBLASLt refuses M = 1), scale_b [L4, ceil(N/128)] "
        "with strides (1, L4), L4 = ceil(K/128) rounded up to 4.",
        "auto: the gemm_fp8_block op through the dispatcher (note: the leaf it ran) on MN-major activation scales (the engine's "
        "layout on a GPU), layout work per call included.",
        "triton: the Triton leaf the gemm_fp8_block selection picks with backend triton (note: the leaf and its config; gemm/tables.py); "
        "mx: gemm_mxfp8's Triton leaf likewise; mx-bf16: both operands dequantized exactly to bf16, one cuBLAS "
        "bf16 GEMM with float32 output. Both MX paths compute the same function.",
        "Weights random N(0, 0.02^2); MXFP8 weights come from power-of-two fp8-block weights.",
    ]
    if b.cuda and scaled_mm.cublas_available(b.device).ok:
        cublas_probe(b)
    deepgemm_prebuild(b, shapes, ms)
    for model, proj, n, k in shapes:
        _shape_pass(b, "", f"{model} {proj}", n, k, ms, lambda case, m, n, k, wt: gemm_one(b, case, m, n, k, wt), bias=True)
    checkpoint()
    for label, (model, proj, n, k), sweep_ms, cands in _sweep_plan(args, shapes, ms, b.cuda):
        _shape_pass(b, "sweep ", f"{model} {proj}", n, k, sweep_ms, lambda case, m, n, k, wt: gemm_configs(b, case, m, n, k, wt, cands(m), label))
        checkpoint()  # results.md stays current should a later (riskier) candidate take the process down


def _shape_pass(b: Bench, phase: str, case: str, n: int, k: int, ms: list[int], one: Callable, bias: bool = False) -> None:
    if not ms:
        return
    b.log(f"== GEMM {phase}{case}: N={n} K={k} (weight {n * k / 1e6:.1f} MB fp8) M={ms}")
    if b.out_of_time():
        b.skipped.append(f"gemm {phase}{case} (time budget)")
        return
    wt = gemm_weights(b, n, k)
    if bias:
        gemm_bias_check(b, case, n, k, wt)
    for m in ms:
        if b.out_of_time():
            b.skipped.append(f"gemm {phase}{case} M={m} (time budget)")
            continue
        one(case, m, n, k, wt)
    del wt
    if b.cuda:
        b.torch.cuda.empty_cache()


# ---- report ---------------------------------------------------------------------------------


def _index(b: Bench) -> tuple[dict, list]:
    rows = [r for r in b.rows if r.family == "gemm" and r.t is not None and not r.backend.startswith("tune")]
    by = {(r.case, r.m, r.backend): r for r in rows}
    combos = list(dict.fromkeys((r.case, r.n, r.k, r.m) for r in rows))  # run order
    return by, combos


def _best_mx(by: dict, case: str, m: int, timing: str) -> Row | None:
    ok = [by[(case, m, p)] for p in MX_PATHS if (case, m, p) in by and by[(case, m, p)].check.startswith("ok")]
    ok = [r for r in ok if getattr(r, timing) is not None]
    return min(ok, key=lambda r: getattr(r, timing), default=None)


def gemm_report(b: Bench) -> list[str]:
    """Per-(shape, M) table, goal lines (graph and eager), crossover and sweep suggestions."""
    by, combos = _index(b)
    lines = [
        "| shape | N | K | M | bf16 ms | cuBLAS ms eager / graph | Triton ms eager / graph (TFLOPS, GB/s, roofline) | Triton host us | "
        "Triton/cuBLAS eager / graph | auto graph ms (ran) | best MXFP8 graph ms | MX/Triton | DeepGEMM graph ms (TFLOPS, config) | Triton/DeepGEMM | checks ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, n, k, m in combos:
        bf, cu, tr, bs, dg = (by.get((case, m, name)) for name in ("bf16", "cublas", "triton", "auto", "deepgemm"))
        mx = _best_mx(by, case, m, "t")
        checks = [r.check for r in b.rows if r.family == "gemm" and r.case == case and r.m == m and r.check != "-" and not r.backend.startswith("tune")]
        lines.append(
            f"| {case} | {n} | {k} | {m} | {fmt(bf and bf.t)} | {fmt(cu and cu.ms)} / {fmt(cu and cu.graph_ms)} | "
            f"{fmt(tr and tr.ms)} / {fmt(tr and tr.graph_ms)} ({fmt(tr and tr.tflops, 0)}, {fmt(tr and tr.gbs, 0)}, {pct(tr and tr.roofline)}) | "
            f"{fmt(tr and tr.host_us, 0)} | {fmt(_ratio(cu, tr, 'ms'), 2)} / {fmt(_ratio(cu, tr, 'graph_ms'), 2)} | "
            f"{fmt(bs and bs.t)} ({bs.note if bs else '-'}) | {fmt(mx and mx.t)} {mx.backend if mx else ''} | {fmt(_ratio(tr, mx, 't'), 2)} | "
            f"{fmt(dg and dg.graph_ms)} ({fmt(dg and dg.tflops, 0)}, {dg.note if dg else '-'}) | {fmt(_ratio(dg, tr, 'graph_ms'), 2)} | "
            f"{sum(c.startswith('ok') for c in checks)}/{len(checks)} |"
        )
    out = lines + [""]
    for timing, label in (("graph_ms", "CUDA graph"), ("ms", "eager")):
        out += _goal_lines(b, by, combos, timing, label)
    return out + [""] + crossover_suggestion(by, combos) + [""] + sweep_report(b)


def _ratio(num: Row | None, den: Row | None, timing: str) -> float | None:
    """num time / den time (> 1: den is faster)."""
    a, c = (getattr(num, timing, None) if num else None), (getattr(den, timing, None) if den else None)
    return a / c if a and c else None


def _goal_lines(b: Bench, by: dict, combos: list, timing: str, label: str) -> list[str]:
    stats: dict[str, list] = {"large": [], "small": [], "small_bs": [], "bw": [], "mx": [], "auto": []}
    for case, n, k, m in combos:
        cu, tr, bs = (by.get((case, m, name)) for name in ("cublas", "triton", "auto"))
        ratio, mx = _ratio(cu, tr, timing), _best_mx(by, case, m, timing)
        if ratio and m >= GOALS["large_m"]:
            stats["large"].append((ratio, case, m))
        if ratio and m <= GOALS["small_m"]:
            stats["small"].append((ratio, case, m))
        if _ratio(cu, bs, timing) and m <= GOALS["small_m"]:
            stats["small_bs"].append((_ratio(cu, bs, timing), case, m))
        t = getattr(tr, timing, None) if tr else None
        if t and m <= GOALS["small_m"] and n * k / 1e6 >= GOALS["decode_weight_mb"]:
            stats["bw"].append((gemm_bytes(m, n, k, "fp8-block") / (t * 1e-3) / 1e9 / b.peaks[2], case, m))
        if mx and _ratio(tr, mx, timing):
            stats["mx"].append((_ratio(tr, mx, timing), case, m))
        best = min((getattr(r, timing) for r in (cu, tr) if r and getattr(r, timing)), default=None)
        if bs and getattr(bs, timing) and best:
            stats["auto"].append((best / getattr(bs, timing), case, m))

    def line(key: str, goal: float, what: str) -> str:
        xs = stats[key]
        if not xs:
            return f"- {what}: no data"
        worst = min(xs, key=lambda t: t[0])
        ok = sum(1 for t in xs if t[0] >= goal)
        return f"- {what}: geomean {geomean([t[0] for t in xs]):.2f}, {ok}/{len(xs)} meet {goal:g}; worst {worst[0]:.2f} ({worst[1]} M={worst[2]})"

    return [
        f"Goals, {label} times:",
        line("large", GOALS["vs_cublas_large"], f"Triton / cuBLAS time ratio at M >= {GOALS['large_m']} (goal >= {GOALS['vs_cublas_large']}x)"),
        line("small", GOALS["vs_cublas_small"], f"Triton / cuBLAS at M <= {GOALS['small_m']} (goal >= {GOALS['vs_cublas_small']}x)"),
        line("small_bs", GOALS["vs_cublas_small"], f"auto (what serving runs) / cuBLAS at M <= {GOALS['small_m']} (goal >= {GOALS['vs_cublas_small']}x)"),
        line("bw", GOALS["decode_bw"], f"Triton HBM share at M <= {GOALS['small_m']}, weights >= {GOALS['decode_weight_mb']} MB (goal >= {GOALS['decode_bw']:.0%})"),
        line("mx", GOALS["mx_vs_fp8"], f"best MXFP8 path / Triton FP8-block (goal >= {GOALS['mx_vs_fp8']}x)"),
        line("auto", 0.95, "auto vs the faster of cuBLAS and Triton (1 = always the faster one)"),
    ]


def crossover_suggestion(by: dict, combos: list) -> list[str]:
    """Per M, which side wins on how many shapes (graph times), and the table rows that follow."""
    out = ["Crossovers (graph times; a path wins a shape when its time is lower):"]
    pairs = (("deepgemm", "triton", "FP8_BLOCK_SM90's deepgemm rows (gemm/tables.py)"), ("mx", "mx-bf16", "MXFP8_ANY's dequant-bf16 row (gemm/tables.py)"))
    for fast, slow, table in pairs:
        wins: dict[int, tuple[int, int]] = {}
        for case, _, _, m in combos:
            a, c = by.get((case, m, fast)), by.get((case, m, slow))
            if a and c and a.t and c.t and a.check.startswith("ok") and c.check.startswith("ok"):
                won, total = wins.get(m, (0, 0))
                wins[m] = (won + (a.t < c.t), total + 1)
        if not wins:
            out.append(f"- {fast} vs {slow}: no data")
            continue
        out.append(f"- {fast} vs {slow}: " + "; ".join(f"M={m}: {fast} {w}/{t}" for m, (w, t) in sorted(wins.items())))
        upto = 0
        for m, (w, t) in sorted(wins.items()):
            if 2 * w < t:
                break
            upto = m
        out.append(f"  suggested {table}: (({upto}, {fast!r}), (INT32_LIMIT, {slow!r}))" if upto else f"  suggested {table}: ((INT32_LIMIT, {slow!r}),)")
    return out


def sweep_report(b: Bench) -> list[str]:
    """Per (path, M): the best candidates (geomean graph ms over the swept shapes) against the table."""
    tuned = [r for r in b.rows if r.backend.startswith("tune") and r.t is not None and r.check.startswith("ok")]
    if not tuned:
        return []
    lines = ["Sweep (geomean ms over the swept shapes, best first; configs measured on every swept shape only; 'table' = the op's table today):"]
    suggest: dict[str, list[str]] = {}
    table_backend = {"tune": "triton", "tune-mx": "mx"}
    for kind in ("tune", "tune-mx"):
        for m in sorted({r.m for r in tuned}):
            per: dict[str, list[Row]] = {}
            for r in tuned:
                if r.m == m and r.backend.split(" ")[0] == kind:
                    per.setdefault(r.note, []).append(r)
            if not per:
                continue
            cases = {r.case for rs in per.values() for r in rs}
            full = {c: rs for c, rs in per.items() if {r.case for r in rs} == cases}
            ranked = sorted(full.items(), key=lambda kv: geomean([r.t for r in kv[1]]))
            table = [r.t for r in b.rows if r.backend == table_backend[kind] and r.m == m and r.case in cases and r.t is not None]
            lines.append(f"- {kind} M={m} ({len(cases)} shapes): table {geomean(table):.4f}; "
                         + "; ".join(f"{rs[0].backend.split(' ', 1)[1]} {geomean([r.t for r in rs]):.4f}" for _, rs in ranked[:5]))  # fmt: skip
            if ranked:
                suggest.setdefault(kind, []).append(f"    ({m}, {ranked[0][0]}),  # {geomean([r.t for r in ranked[0][1]]):.4f} ms vs table {geomean(table):.4f}")
    for kind, rows in suggest.items():
        lines += [f"Suggested rows for the {table_backend[kind]} table (best per swept M; merge neighbouring M that agree):", *rows]
    return lines


def gemm_short(b: Bench) -> list[str]:
    """Per M, over the shapes: geomean TFLOPS (graph times) of each backend and geomean time ratios."""
    by, combos = _index(b)
    names = ("bf16", "cublas", "triton", "auto", "deepgemm")
    out = [f"{'M':>5} | {'bf16':>6} | {'cuBLAS':>6} | {'Triton':>6} | {'auto':>6} | {'bestMX':>6} | {'Tri/cuB':>7} | {'(eager)':>7} | {'MX/Tri':>6} | {'TriGB/s':>7} | {'host us':>7} | {'DeepGEMM':>8} | {'Tri/DG':>6}   (geomean TFLOPS over shapes, graph times)"]
    for m in sorted({c[3] for c in combos}):
        cases = [c[0] for c in combos if c[3] == m]
        row = {name: [by[(c, m, name)] for c in cases if (c, m, name) in by] for name in names}
        tf = {name: geomean([r.tflops for r in rs]) for name, rs in row.items()}
        mx = [(_best_mx(by, c, m, "t"), by.get((c, m, "triton"))) for c in cases]
        mx_tf = geomean([x.tflops for x, _ in mx if x])
        r_g = geomean([_ratio(by.get((c, m, "cublas")), by.get((c, m, "triton")), "graph_ms") for c in cases])
        r_e = geomean([_ratio(by.get((c, m, "cublas")), by.get((c, m, "triton")), "ms") for c in cases])
        r_mx = geomean([_ratio(t, x, "t") for x, t in mx if x and t])
        gbs = geomean([r.gbs for r in row["triton"]])
        host = geomean([r.host_us for r in row["triton"]])
        r_dg = geomean([_ratio(by.get((c, m, "deepgemm")), by.get((c, m, "triton")), "graph_ms") for c in cases if (c, m, "deepgemm") in by])
        out.append(f"{m:>5} | {tf['bf16']:6.0f} | {tf['cublas']:6.0f} | {tf['triton']:6.0f} | {tf['auto']:6.0f} | {mx_tf:6.0f} | {r_g:7.2f} | {r_e:7.2f} | {r_mx:6.2f} | {gbs:7.0f} | {host:7.0f} | "
                   f"{fmt(tf['deepgemm'], 0):>8} | {fmt(r_dg, 2):>6}")
    return out
