"""Fused MoE at few tokens: per-launch device times (torch.profiler, L2 flushed before each call)
of the default config and variants (stages, warps, split-K, tiles, fused quantization), against
the dense small-M FP8-block GEMM streaming the same expert bytes as one weight.

    python scripts/profile_moe.py
"""
import os, sys, collections
import torch
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/scripts")
from torch.profiler import profile, ProfilerActivity
from bench_moe import MODELS, build_experts
from quantkit.kernels.fused_moe import fused_moe, MoeConfig, pick_moe_config
from quantkit.kernels.fused_moe_ref import MoeSpec
from quantkit.kernels.moe_routing import route
from quantkit.kernels import dispatch
dev = torch.device("cuda")
flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)

def launches(fn, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            flush.zero_(); fn()
        torch.cuda.synchronize()
    evs = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA and "elementwise" not in e.name and "fill" not in e.name.lower()]
    per = len(evs) // n
    out = collections.defaultdict(list)
    for i, e in enumerate(evs):
        out[(i % per, e.name[:28])].append(e.device_time)
    return [(k[1], sorted(v)[len(v) // 2]) for k, v in sorted(out.items())]

for mname in ("gpt-oss-120b", "deepseek-v3"):
    m = MODELS[mname]
    gpt = m.activation == "gpt-oss"
    spec = MoeSpec(m.activation, interleaved=gpt)
    w13, _ = build_experts(torch, "fp8-block", m.e, 2 * m.inter, m.h, gpt, dev)
    w2, _ = build_experts(torch, "fp8-block", m.e, m.h, m.inter, gpt, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    corr = torch.randn(m.e, device=dev, generator=gen) * 0.1 if m.rule == "grouped_sigmoid" else None
    for t in (1, 4, 16):
        x = torch.randn(t, m.h, device=dev, generator=gen).to(torch.bfloat16)
        wts, ids = route(torch.randn(t, m.e, device=dev, generator=gen), m.rule, m.top_k, correction_bias=corr, **dict(m.route_kw))
        hit = int(torch.unique(ids).numel())
        b1, b2 = hit * w13.q[0].numel(), hit * w2.q[0].numel()
        base = pick_moe_config(t * m.top_k, m.e, "fp8-block")
        print(f"== {mname} T={t}: {hit} experts; GEMM1 {b1/1e6:.1f} MB (roof {b1/4.8e6:.1f} us), GEMM2 {b2/1e6:.1f} MB (roof {b2/4.8e6:.1f} us); default {base.name()}", flush=True)
        variants = [base] + [MoeConfig(**{**base.__dict__, **kw}) for kw in (
            dict(num_stages=2), dict(num_stages=3), dict(num_stages=6), dict(split_k=1), dict(num_warps=2), dict(num_warps=8),
            dict(block_n1=32, block_n2=32), dict(block_n1=128, block_n2=128), dict(fuse_quant=not base.fuse_quant), dict(waves=4), dict(waves=16))]
        for cfg in variants:
            try:
                r = launches(lambda: fused_moe(x, wts, ids, w13, w2, spec, config=cfg))
            except Exception as e:
                print("   ERR", cfg.name(), str(e)[:120]); continue
            g = [v for k, v in r if "moe_gemm" in k]
            tot = sum(v for _, v in r)
            print(f"   {cfg.name():<28} total {tot:6.1f} us  gemm1 {g[0]:6.1f} ({b1/g[0]/4.8e6:.0%})  gemm2 {g[1]:6.1f} ({b2/g[1]/4.8e6:.0%})  " + " ".join(f"{k[:12]}={v:.1f}" for k, v in r if 'moe_gemm' not in k), flush=True)
        # dense small-M GEMM on the same bytes
        for nb, (n_, k_) in (("gemm1", (hit * 2 * m.inter, m.h)), ("gemm2", (hit * m.h, m.inter))):
            kp = -(-k_ // 128) * 128
            w = torch.zeros(n_, kp, dtype=torch.float8_e4m3fn, device=dev)
            w[:, :k_] = (torch.randn(n_, k_, device=dev) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
            w = w[:, :k_] if k_ % 16 == 0 else w
            ws = torch.rand(-(-n_ // 128), -(-w.shape[1] // 128), device=dev) + 0.5
            a = (torch.randn(t, w.shape[1], device=dev) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
            sa = torch.rand(t, -(-w.shape[1] // 128), device=dev) + 0.5
            r = launches(lambda: dispatch.call("gemm_fp8_block", a, sa, w, ws, backend="triton"))
            tt = sum(v for _, v in r)
            print(f"   dense skinny {nb} [{n_}, {w.shape[1]}] M={t}: {tt:6.1f} us ({n_*w.shape[1]/tt/4.8e6:.0%})", flush=True)
            del w
    del w13, w2
    torch.cuda.empty_cache()
