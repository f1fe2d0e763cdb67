"""Fused MoE at few tokens, launch by launch: device times (torch.profiler, L2 flushed before each
call, median of 10) of the default config and variants (stages, warps, split-K, tiles, K step)
for GPT-OSS-120B and DeepSeek-V3 FP8-block experts (the moe benchmark's random experts and
routing), against the dense small-M FP8-block GEMM streaming the same expert bytes as one weight.
A profile printed for reading, CUDA only; the moe benchmark's records hold the figures.

    quantkit bench profile-moe [--tokens 1 4 16]
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import replace

from .moe import MODELS, model_experts, tokens  # same experts and batches as the benchmark
from .timer import read_flush

VARIANTS = ({}, {"num_stages": 2}, {"num_stages": 3}, {"num_stages": 6}, {"num_warps": 2}, {"num_warps": 8},
            {"block_n1": 32, "block_n2": 32}, {"block_n1": 128, "block_n2": 128}, {"waves": 4}, {"waves": 16},
            {"block_k": 256, "num_stages": 3}, {"block_k": 128, "num_stages": 4})  # fmt: skip
HBM_BYTES_US = 4.8e6  # bytes per microsecond at 4.8 TB/s


def launches(torch, fn, flush, reps: int = 10) -> list[tuple[str, float]]:
    """(kernel name, median us) per launch of one ``fn`` call, in launch order."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()  # a read flush: the L2 left clean (timer.FLUSH_BYTES)
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "elementwise" not in e.name and "reduce_kernel" not in e.name]
    per_call = len(events) // reps
    times = collections.defaultdict(list)
    for i, e in enumerate(events):
        times[(i % per_call, e.name[:28])].append(e.device_time)
    return [(name, sorted(v)[len(v) // 2]) for (_, name), v in sorted(times.items())]


def dense_us(torch, flush, n: int, k: int, t: int) -> float:
    """Our small-M FP8-block GEMM on an [n, k] weight (k padded to 128 when it is not a multiple of 16)."""
    from quantkit.kernels import dispatch

    kp = k if k % 16 == 0 else -(-k // 128) * 128
    w = torch.zeros(n, kp, dtype=torch.float8_e4m3fn, device="cuda")
    w[:, :k] = (torch.randn(n, k, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    ws = torch.rand(-(-n // 128), -(-kp // 128), device="cuda") + 0.5
    a = (torch.randn(t, kp, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    sa = torch.rand(t, -(-kp // 128), device="cuda") + 0.5
    return sum(us for _, us in launches(torch, lambda: dispatch.call("gemm_fp8_block", a, sa, w, ws, backend="triton"), flush))


def profile_model(torch, name: str, token_counts: list[int], flush) -> None:
    from quantkit.kernels.moe.fused_moe import fused_moe
    from quantkit.kernels.moe.select import select_call

    m, dev = MODELS[name], torch.device("cuda")
    ex = model_experts(torch, "fp8-block", m, dev)
    spec, w13, w2 = ex.spec, ex.w13, ex.w2
    for t in token_counts:
        x, wts, ids = tokens(torch, ex, t, dev)
        hit = int(torch.unique(ids).numel())
        b1, b2 = hit * w13.q[0].numel(), hit * w2.q[0].numel()
        base = select_call(x, wts, ids, w13, w2, spec).config
        print(f"== {name} T={t}: {hit} experts; GEMM 1 {b1 / 1e6:.1f} MB, GEMM 2 {b2 / 1e6:.1f} MB; default {base.name()}", flush=True)
        for kw in VARIANTS:
            cfg = replace(base, **kw)
            rows = launches(torch, lambda cfg=cfg, x=x, wts=wts, ids=ids: fused_moe(x, wts, ids, w13, w2, spec, config=cfg), flush)
            g1, g2 = (us for name_, us in rows if "gemm_kernel" in name_)  # gathered or sorted rows
            rest = " ".join(f"{name_[:12]}={us:.1f}" for name_, us in rows if "gemm_kernel" not in name_)
            print(f"   {cfg.name():<28} total {sum(us for _, us in rows):6.1f} us  GEMM 1 {g1:6.1f} ({b1 / g1 / HBM_BYTES_US:.0%})  "
                  f"GEMM 2 {g2:6.1f} ({b2 / g2 / HBM_BYTES_US:.0%})  {rest}", flush=True)  # fmt: skip
        for label, n, k in (("GEMM 1", hit * 2 * m.inter, m.h), ("GEMM 2", hit * m.h, m.inter)):
            us = dense_us(torch, flush, n, k, t)
            print(f"   dense small-M {label} [{n}, {k}] M={t}: {us:6.1f} us ({n * k / us / HBM_BYTES_US:.0%})", flush=True)


def main(argv: list[str]) -> None:
    from . import prog

    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("profile-moe profiles CUDA kernels: no CUDA device here")
    flush = read_flush(torch, "cuda")
    for name in args.models:
        profile_model(torch, name, args.tokens, flush)
        torch.cuda.empty_cache()

