"""Every Triton launch the ops' launchers make on an H200, captured without a GPU and compiled for sm_90.

tests/kernels/test_compile_sm90.py runs :func:`main` in a process of its own, *without* ``TRITON_INTERPRET``; by hand
(every scenario but the self-test, whose kernel lives in that test file)::

    env -u TRITON_INTERPRET python tests/kernels/sm90_launches.py --out report.json [--jobs 2] [--only scenario,...]

How: Triton's active driver is replaced by one that reports an sm_90 device (``GPUTarget("cuda", 90, 32)``), and
``JITFunction._do_compile`` by a recorder, so ``kernel[grid](...)`` binds and specializes its arguments with Triton's
own binder (signature, constexprs, divisibility attributes, options) and returns without compiling or launching.  The
launchers run on small CPU tensors with the device questions they ask (``dispatch.target`` / ``capability`` /
``sm_count``, ``triton_numerics.compiled_sm90``, wgmma availability) answered as on the H200 (sm_90, 132 SMs), so
they choose the sm_90 kernels and constexprs (PDL, hardware E4M3 casts, TMA, Gluon wgmma).  Each distinct
(kernel, signature, constexprs, attributes, options) is then compiled with ``triton.compile`` for sm_90, ptxas included.

Kernel outputs are never written, so a launcher that reads one on the host gets what ``torch.empty`` left: the MoE
alignment is recorded and then recomputed by :func:`..routing.align_torch` for the rows that follow.

Scenario bodies import quantkit themselves: importing this module (for :data:`SCENARIOS`) imports neither quantkit
nor Triton.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ARCH = 90  # GPUTarget("cuda", 90, 32)
H200_SMS = 132


@dataclass(frozen=True)
class Scenario:
    name: str
    ops: tuple[str, ...]  # the dispatch ops whose Triton launchers it runs
    kernels: tuple[str, ...]  # kernels (function names) it must launch
    run: Callable[[], None]


SCENARIOS: dict[str, Scenario] = {}  # the ops' launches
SELFTESTS: dict[str, Scenario] = {}  # kernels that must fail to compile


def scenario(name: str, ops: tuple[str, ...], kernels: tuple[str, ...],
             into: dict[str, Scenario] = SCENARIOS) -> Callable[[Callable[[], None]], Callable[[], None]]:  # fmt: skip
    def deco(fn: Callable[[], None]) -> Callable[[], None]:
        assert name not in SCENARIOS and name not in SELFTESTS, name
        into[name] = Scenario(name, ops, kernels, fn)
        return fn

    return deco


# ---- capture ------------------------------------------------------------------------------------------------


@dataclass
class Launch:
    fn: Any  # the JITFunction / GluonJITFunction
    signature: dict[str, Any]
    constexprs: dict[tuple[int, ...], Any]
    attrs: dict[tuple[int, ...], Any]
    options: Any  # the backend's options (CUDAOptions)

    @property
    def kernel(self) -> str:
        return self.fn.fn.__name__

    @property
    def where(self) -> str:
        return f"{self.fn.fn.__module__}.{self.fn.fn.__qualname__}"

    def key(self) -> str:
        names = [p.name for p in self.fn.params]
        consts = {names[p[0]] if len(p) == 1 else str(p): _show(v) for p, v in sorted(self.constexprs.items())}
        sig = {k: v for k, v in self.signature.items() if v != "constexpr"}
        attrs = {names[p[0]] if len(p) == 1 else str(p): v for p, v in sorted(self.attrs.items()) if v}
        opts = {k: self.options.__dict__[k] for k in ("num_warps", "num_stages", "num_ctas", "launch_pdl", "enable_fp_fusion", "debug")
                if k in self.options.__dict__}  # fmt: skip
        return json.dumps({"kernel": self.where, "sig": sig, "const": consts, "attrs": attrs, "opts": opts,
                           "all_opts": repr(sorted(self.options.__dict__.items()))}, default=str)  # fmt: skip

    def describe(self) -> dict[str, Any]:
        k = json.loads(self.key())
        k.pop("all_opts")
        return k


def _show(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)


LAUNCHES: list[Launch] = []


class Sm90Driver:
    """Just enough of a Triton driver for ``JITFunction.run`` to bind and specialize for sm_90."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", ARCH, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def is_active(self) -> bool:
        return True


def install() -> None:
    """Capture mode: launches record instead of compiling, every device question gets the H200's answer."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compiling for sm_90 needs the compiled Triton: unset TRITON_INTERPRET")
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(Sm90Driver())

    def record(self, key, signature, device, constexprs, options, attrs, warmup):
        LAUNCHES.append(Launch(self, dict(signature), dict(constexprs), dict(attrs), options))
        return None  # run() returns None: nothing compiles, nothing launches

    JITFunction._do_compile = record

    import quantkit.kernels  # noqa: F401  (registers every backend)
    from quantkit.kernels import dispatch, triton_numerics
    from quantkit.kernels.gemm import select as gemm_select
    from quantkit.kernels.gemm import wgmma
    from quantkit.kernels.moe import fused_moe, routing

    assert not triton_numerics.interpreted(), "quantkit.kernels was imported in interpreter mode"
    h200 = dispatch.TARGETS["h200"]
    assert h200.capability == (9, 0) and h200.sms == H200_SMS
    orig = {"capability": dispatch.capability, "sm_count": dispatch.sm_count, "target": dispatch.target}
    fakes = {"capability": lambda device: (9, 0), "sm_count": lambda device: H200_SMS, "target": lambda device: h200}
    for name, mod in list(sys.modules.items()):  # the functions, wherever a module imported them by name
        if mod is None or not name.startswith("quantkit.kernels"):
            continue
        for attr, fn in orig.items():
            if getattr(mod, attr, None) is fn:
                setattr(mod, attr, fakes[attr])
    triton_numerics.compiled_sm90 = lambda device: True  # pdl_ok, hw_e4m3
    wgmma.wgmma_available = lambda device: dispatch.Availability(True)
    gemm_select.device_target = lambda device: gemm_select._probed(h200, False, True)  # wgmma; DeepGEMM is not Triton

    real_align = fused_moe.align

    def align(topk_ids, num_experts, block_m, pdl=False):
        real_align(topk_ids, num_experts, block_m, pdl)  # records the alignment kernel
        return routing.align_torch(topk_ids, num_experts, block_m)  # rows the host reads next

    fused_moe.align = align


def run_scenario(s: Scenario) -> tuple[list[Launch], str | None]:
    """The launches ``s`` makes, and the error that stopped it (None: it ran through)."""
    start = len(LAUNCHES)
    err = None
    try:
        s.run()
    except Exception:  # a launcher that fails on the host: reported, not hidden
        err = traceback.format_exc(limit=8)[-4000:]
    return LAUNCHES[start:], err


# ---- compile ------------------------------------------------------------------------------------------------

_JOBS: list[Launch] = []


def compile_one(i: int) -> tuple[int, str, str, float]:
    """(job, "ok" / "error", message, seconds) of compiling job ``i`` for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget

    job = _JOBS[i]
    t0 = time.perf_counter()
    try:
        src = job.fn.ASTSource(job.fn, job.signature, job.constexprs, job.attrs)  # GluonASTSource for Gluon kernels
        triton.compile(src, target=GPUTarget("cuda", ARCH, 32), options=job.options.__dict__)
    except Exception as e:  # CompilationError, ptxas failures, ...
        return i, "error", explain(e), time.perf_counter() - t0
    return i, "ok", "", time.perf_counter() - t0


def explain(e: BaseException) -> str:
    """The error and its causes, innermost last (a CompilationError in a called function names the call site first)."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(f"{type(e).__name__}: {e}"[-2500:])
        e = e.__cause__ or e.__context__
    return "\n--- caused by ---\n".join(parts)[-8000:]


def compile_all(jobs: list[Launch], n_jobs: int) -> list[tuple[int, str, str, float]]:
    _JOBS[:] = jobs
    if n_jobs <= 1 or len(jobs) <= 1:
        return [compile_one(i) for i in range(len(jobs))]
    import multiprocessing as mp

    with mp.get_context("fork").Pool(n_jobs) as pool:  # compiling is pure Python + MLIR + ptxas: no torch in the workers
        return list(pool.imap_unordered(compile_one, range(len(jobs)), chunksize=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--capture-only", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    install()
    every = {**SCENARIOS, **SELFTESTS}
    names = [n for n in args.only.split(",") if n] or list(every)
    unique: dict[str, int] = {}
    jobs: list[Launch] = []
    report: dict[str, Any] = {"scenarios": {}, "compiles": []}
    for name in names:
        launches, err = run_scenario(every[name])
        ids = []
        for launch in launches:
            k = launch.key()
            if k not in unique:
                unique[k] = len(jobs)
                jobs.append(launch)
            ids.append(unique[k])
        report["scenarios"][name] = {"error": err, "compiles": sorted(set(ids))}
    report["capture_s"] = time.perf_counter() - t0
    results = [] if args.capture_only else compile_all(jobs, args.jobs)
    by_job = {i: (status, msg, sec) for i, status, msg, sec in results}
    for i, job in enumerate(jobs):
        status, msg, sec = by_job.get(i, ("not compiled", "", 0.0))
        report["compiles"].append({"kernel": job.kernel, "where": job.where, "launch": job.describe(), "status": status, "error": msg,
                                   "seconds": round(sec, 2)})  # fmt: skip
    report["total_s"] = time.perf_counter() - t0
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    return 0


# ---- scenarios: the served models' shapes at a few tokens ----------------------------------------------------


def _g():
    import torch

    return torch.Generator().manual_seed(0)


def _randn(*shape, dtype=None):
    import torch

    return torch.randn(*shape, generator=_g()).to(dtype or torch.bfloat16)


def _call(op: str, *args, **kwargs):
    """The op's registered Triton backend: its selection (as on the H200), then the leaf it picks."""
    from quantkit.kernels import dispatch

    b = dispatch.REGISTRY.ops[op]["triton"]
    return b.run(*args, **kwargs)


def _paged(b: int, hkv: int, d: int, dv: int, ctx: list[int], page: int = 16, dtype=None):
    """A paged KV cache [slots, Hkv, D/Dv] with int64 block tables [B, max_blocks] and int32 context lengths."""
    import torch

    n_blocks = [-(-c // page) for c in ctx]
    width = max(n_blocks)
    tables = torch.full((b, width), -1, dtype=torch.int64)
    nxt = 0
    for i, nb in enumerate(n_blocks):
        tables[i, :nb] = torch.arange(nxt, nxt + nb)
        nxt += nb
    slots = max(nxt, 1) * page
    return (_randn(slots, hkv, d, dtype=dtype), _randn(slots, hkv, dv, dtype=dtype), tables,
            torch.tensor(ctx, dtype=torch.int32))  # fmt: skip


ATTN_MODELS = {  # (hq, hkv, d, dv, sinks, window)
    "gpt_oss": (64, 8, 64, 64, True, 128),
    "qwen3": (32, 4, 128, 128, False, None),
}


def _prefill(hq, hkv, d, dv, sinks, window, paged=False, dtype=None):
    import torch

    lens_q, lens_k = [100, 37], ([300, 37] if paged else [100, 37])
    t = sum(lens_q)
    q = _randn(t, hq, d, dtype=dtype)
    cu_q = torch.tensor([0, lens_q[0], t], dtype=torch.int32)
    cu_k = torch.tensor([0, lens_k[0], sum(lens_k)], dtype=torch.int32)
    s = _randn(hq, dtype=dtype) if sinks else None
    if paged:
        k, v, tables, _ = _paged(2, hkv, d, dv, lens_k, dtype=dtype)
        _call("attention_prefill", q, k, v, cu_q, cu_k, d**-0.5, s, window, tables, 16)
    else:
        k, v = _randn(t, hkv, d, dtype=dtype), _randn(t, hkv, dv, dtype=dtype)
        _call("attention_prefill", q, k, v, cu_q, cu_k, d**-0.5, s, window)


@scenario("attention_prefill_gpt_oss", ("attention_prefill",), ("_prefill_kernel",))
def _():
    _prefill(*ATTN_MODELS["gpt_oss"])
    _prefill(*ATTN_MODELS["gpt_oss"][:5], None)  # GPT-OSS's full-attention layers
    _prefill(*ATTN_MODELS["gpt_oss"], paged=True)  # chunked prefill over the cache


@scenario("attention_prefill_qwen3_deepseek", ("attention_prefill",), ("_prefill_kernel",))
def _():
    import torch

    _prefill(*ATTN_MODELS["qwen3"])
    _prefill(16, 16, 192, 128, False, None)  # DeepSeek-V3 MLA prefill: d 192, dv 128
    _prefill(*ATTN_MODELS["qwen3"], dtype=torch.float32)  # float32's own tiles


def _decode(hq, hkv, d, dv, sinks, window, b, ctx):
    k, v, tables, lens = _paged(b, hkv, d, dv, [ctx] * b)
    s = _randn(hq) if sinks else None
    _call("attention_decode", _randn(b, hq, d), k, v, tables, lens, 16, d**-0.5, s, window)


@scenario("attention_decode", ("attention_decode",), ("_decode_split_kernel", "_decode_merge_kernel"))
def _():
    for model in ("gpt_oss", "qwen3"):
        _decode(*ATTN_MODELS[model], b=1, ctx=1000)  # several KV splits, then the merge
        _decode(*ATTN_MODELS[model], b=64, ctx=40)  # one split writes the output
    _decode(*ATTN_MODELS["gpt_oss"][:5], None, b=2, ctx=700)


@scenario("rope", ("rope_rotate", "rope_cache_write"), ("_rope_kernel", "_rope_cache_kernel"))
def _():
    import torch

    for dtype in (torch.bfloat16, torch.float32):
        for style, (hq, hkv, d) in (("half", (32, 4, 128)), ("interleaved", (64, 8, 64))):
            t = 7
            cos, sin = _randn(t, d // 2, dtype=dtype), _randn(t, d // 2, dtype=dtype)
            _call("rope_rotate", _randn(t, hq, d, dtype=dtype), cos, sin, style)
            q, k, v = _randn(t, hq, d, dtype=dtype), _randn(t, hkv, d, dtype=dtype), _randn(t, hkv, d, dtype=dtype)
            kc, vc = torch.zeros(64, hkv, d, dtype=dtype), torch.zeros(64, hkv, d, dtype=dtype)
            _call("rope_cache_write", q, k, v, cos, sin, style, torch.arange(t, dtype=torch.int64) + 3, kc, vc)


@scenario("add_rmsnorm", ("add_rmsnorm",), ("_add_rmsnorm_kernel",))
def _():
    import torch

    for k, dtype, order in ((2880, torch.bfloat16, "hf"), (7168, torch.bfloat16, "f32"), (2048, torch.float32, "hf")):
        _call("add_rmsnorm", _randn(5, k, dtype=dtype), _randn(5, k, dtype=dtype), _randn(k, dtype=dtype), 1e-6, order)


@scenario("router_topk", ("router_topk",), ("_router_kernel",))
def _():
    _call("router_topk", _randn(3, 2880), _randn(32, 2880), _randn(32), 4, "topk_softmax")  # GPT-OSS
    _call("router_topk", _randn(3, 2048), _randn(128, 2048), None, 8, "softmax_topk", True)  # Qwen3-MoE


# -- MoE: one call per row of the H200's table, both formats, both gate/up layouts


def _experts(fmt: str, e: int, n: int, k: int, bias: bool):
    import torch

    from quantkit.kernels.moe.fused_moe_ref import ExpertWeights

    q = torch.zeros(e, n, k, dtype=torch.float8_e4m3fn)
    if fmt == "fp8-block":
        s = torch.ones(e, -(-n // 128), -(-k // 128))
    else:
        s = torch.full((e, n, k // 32), 127, dtype=torch.uint8)
    return ExpertWeights(fmt, q, s, _randn(e, n) if bias else None)


def _moe(fmt: str, interleaved: bool, tokens: tuple[int, ...], e: int = 64, top_k: int = 2, h: int = 256, inter: int = 256):
    import torch

    from quantkit.kernels.moe.fused_moe_ref import MoeSpec

    spec = MoeSpec("gpt-oss", True) if interleaved else MoeSpec("silu", False)
    w13 = _experts(fmt, e, 2 * inter, h, interleaved)
    w2 = _experts(fmt, e, h, inter, interleaved)
    for t in tokens:
        ids = (torch.arange(t * top_k, dtype=torch.int64).reshape(t, top_k) * 7) % e
        _call("fused_moe", _randn(t, h), torch.full((t, top_k), 0.5), ids, w13, w2, spec)


MOE_TOKENS = (1, 16, 512, 1536, 5120)  # 1/32, 0.5, 16, 48, 160 pairs per expert (E 64, top 2)
MOE_PREFILL = (8192,)


@scenario("fused_moe_fp8_block_steps", ("fused_moe",), ("_moe_gemm_kernel", "_combine_kernel", "_align_small_kernel", "_align_kernel", "_group_quant_kernel"))
def _():
    _moe("fp8-block", False, MOE_TOKENS)
    _moe("fp8-block", True, MOE_TOKENS[:2])


@scenario("fused_moe_mxfp8_steps", ("fused_moe",), ("_moe_gemm_kernel", "_combine_kernel", "_group_quant_kernel"))
def _():
    _moe("mxfp8", True, MOE_TOKENS)
    _moe("mxfp8", False, MOE_TOKENS[:2])


@scenario("fused_moe_sorted", ("fused_moe",), ("_sorted_gemm_kernel", "_combine_kernel", "_group_quant_kernel"))
def _():
    _moe("mxfp8", True, MOE_PREFILL)
    _moe("mxfp8", False, MOE_PREFILL)
    from quantkit.kernels.moe import tables

    _moe_config("fp8-block", False, tables.PREFILL_TILED)  # FP8-block prefill where the wgmma kernel cannot run


def _moe_config(fmt: str, interleaved: bool, cfg, t: int = 8192, e: int = 64, top_k: int = 2, h: int = 256, inter: int = 256):
    import torch

    from quantkit.kernels.moe import fused_moe
    from quantkit.kernels.moe.fused_moe_ref import MoeSpec

    spec = MoeSpec("gpt-oss", True) if interleaved else MoeSpec("silu", False)
    w13, w2 = _experts(fmt, e, 2 * inter, h, interleaved), _experts(fmt, e, h, inter, interleaved)
    ids = (torch.arange(t * top_k, dtype=torch.int64).reshape(t, top_k) * 7) % e
    fused_moe.fused_moe(_randn(t, h), torch.full((t, top_k), 0.5), ids, w13, w2, spec, config=cfg)


@scenario("fused_moe_sorted_wgmma", ("fused_moe",), ("moe_gemm_ws", "_combine_kernel", "_group_quant_kernel"))
def _():
    from dataclasses import replace

    from quantkit.kernels.moe import tables

    _moe("fp8-block", False, MOE_PREFILL)
    _moe("fp8-block", True, MOE_PREFILL)
    row = tables.H200["fp8-block"][-1].config
    _moe_config("fp8-block", False, replace(row, block_m=128))  # the kernel's other expert block


# -- GEMMs: every Triton row of the H200's tables, through the op's selection


def _gemm_operands(fmt: str, m: int, n: int, k: int):
    import torch

    a = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    w = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    if fmt == "fp8-block":
        return a, torch.ones(m, -(-k // 128)), w, torch.ones(-(-n // 128), -(-k // 128))
    return a, torch.full((m, k // 32), 127, dtype=torch.uint8), w, torch.full((n, k // 32), 127, dtype=torch.uint8)


def _gemm(op: str, fmt: str, m: int, n: int, k: int, bias: bool = False, out_dtype=None, backend: str = "triton", config=None):
    import torch

    from quantkit.kernels import dispatch

    a, sa, w, sw = _gemm_operands(fmt, m, n, k)
    b = _randn(n) if bias else None
    out_dtype = out_dtype or torch.bfloat16
    kw = {} if config is None else {"config": config}
    c = dispatch.REGISTRY.ops[op][backend].choose(a, sa, w, sw, b, out_dtype, **kw)
    c.run(a, sa, w, sw, b, out_dtype)
    return c


@scenario("gemm_fp8_block_skinny", ("gemm_fp8_block",), ("_skinny_kernel",))
def _():
    _gemm("gemm_fp8_block", "fp8-block", 1, 2880, 2880, bias=True)  # K not split
    _gemm("gemm_fp8_block", "fp8-block", 4, 7168, 16384)  # split-K
    _gemm("gemm_fp8_block", "fp8-block", 32, 2112, 7168)  # the K > 4096 row
    _gemm("gemm_fp8_block", "fp8-block", 7, 576, 200)  # K % 128 != 0, partial scale tiles


@scenario("gemm_fp8_block_wgmma", ("gemm_fp8_block",), ("fp8_block_gemm_ws",))
def _():
    import torch

    _gemm("gemm_fp8_block", "fp8-block", 48, 5120, 2880)  # M 33-64
    _gemm("gemm_fp8_block", "fp8-block", 128, 2112, 7168)  # narrow tiles, split-K
    _gemm("gemm_fp8_block", "fp8-block", 1024, 2880, 4096, bias=True)  # large M
    _gemm("gemm_fp8_block", "fp8-block", 300, 2888, 512, out_dtype=torch.float32)  # float32 out
    _gemm("gemm_fp8_block", "fp8-block", 300, 2890, 512)  # output rows not 16-byte aligned: masked stores


@scenario("gemm_fp8_block_tiled", ("gemm_fp8_block",), ("_tiled_kernel",))
def _():
    from quantkit.kernels.gemm import tables

    _gemm("gemm_fp8_block", "fp8-block", 200, 2880, 2888)  # rows not 16-byte aligned: no wgmma, no TMA
    _gemm("gemm_fp8_block", "fp8-block", 2000, 2880, 2888)
    _gemm("gemm_fp8_block", "fp8-block", 300, 2880, 2880, config=tables.TILED_MID)  # the tiles of every other device
    _gemm("gemm_fp8_block", "fp8-block", 2000, 2880, 2880, bias=True, config=tables.TILED_LARGE)  # TMA, persistent off


@scenario("gemm_mxfp8", ("gemm_mxfp8",), ("_skinny_kernel", "_tiled_kernel", "_mx_to_bf16_kernel"))
def _():
    _gemm("gemm_mxfp8", "mxfp8", 1, 2880, 2880, bias=True)
    _gemm("gemm_mxfp8", "mxfp8", 48, 2880, 2880)  # upcast skinny
    _gemm("gemm_mxfp8", "mxfp8", 300, 2880, 2880)  # upcast tiles
    _gemm("gemm_mxfp8", "mxfp8", 1024, 2880, 2880)  # upcast tiles, TMA
    _gemm("gemm_mxfp8", "mxfp8", 1024, 2880, 2880, backend="dequant-bf16")


# -- activation quantization, weight conversion


@scenario("group_quant", ("act_quant_fp8_block", "act_quant_mxfp8", "mxfp8_quantize"), ("_group_quant_kernel",))
def _():
    import torch

    from quantkit.formats.rounding import Rounding

    x = _randn(37, 2880)
    for sf in ("float", "ue8m0"):
        _call("act_quant_fp8_block", x, sf, "rceil")
    _call("act_quant_fp8_block", _randn(4096, 7168), "ue8m0", "rceil", scale_mn=True)  # DeepGEMM's MN-major scales
    _call("act_quant_mxfp8", x, "rceil")
    _call("act_quant_fp8_block", x, "ue8m0", "rceil", hw_cast=False)  # the assembled E4M3 byte, asked for explicitly
    _call("mxfp8_quantize", x, "rceil", hw_cast=False)
    _call("mxfp8_quantize", _randn(4, 2880, 2880, dtype=torch.float32), "floor",
          Rounding("stochastic", seed=11, name="w", offset=2**32 - 12345))  # fmt: skip


@scenario("fused_act_quant", ("rmsnorm_act_quant", "silu_mul_act_quant", "swiglu_act_quant"), ("_rmsnorm_quant_kernel", "_act_quant_kernel"))
def _():
    for fmt, sf in (("fp8-block", "float"), ("fp8-block", "ue8m0"), ("mxfp8", "float")):
        _call("rmsnorm_act_quant", _randn(5, 7168), _randn(7168), 1e-6, fmt, sf, "rceil")
        _call("silu_mul_act_quant", _randn(5, 2048), _randn(5, 2048), fmt, sf, "rceil")
        _call("swiglu_act_quant", _randn(5, 5760), fmt, sf, "rceil")


@scenario("fp8_block_quant", ("fp8_block_quantize_weight",), ("_fp8_block_quant_kernel",))
def _():
    from quantkit.formats.rounding import Rounding

    for sf in ("float", "ue8m0"):
        _call("fp8_block_quantize_weight", _randn(576, 7168), sf, "rceil")
    _call("fp8_block_quantize_weight", _randn(576, 7168), "float", "rceil", hw_cast=False)
    _call("fp8_block_quantize_weight", _randn(2, 300, 2880), "float", "rceil",
          Rounding("stochastic", seed=11, name="w", offset=2**32 - 12345))  # fmt: skip


@scenario("mxfp4_decode", ("mxfp4_decode",), ("_mxfp4_decode_kernel",))
def _():
    import torch

    blocks = torch.zeros(2, 64, 90, 16, dtype=torch.uint8)
    scales = torch.full((2, 64, 90), 127, dtype=torch.uint8)
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        _call("mxfp4_decode", blocks, scales, dtype)


@scenario("mla_decode", ("mla_decode",), ("_mla_split_kernel", "_decode_merge_kernel"))
def _():
    for b, ctx in ((1, 4000), (64, 50)):  # several KV splits and the merge; one split
        kv, k_rot, tables, lens = _paged(b, 1, 512, 64, [ctx] * b)  # one latent "head": kv [slots, 512], k_rot [slots, 64]
        _call("mla_decode", _randn(b, 128, 512), _randn(b, 128, 64), kv[:, 0], k_rot[:, 0], tables, lens, 16, 0.1)


@scenario("selftest_mismatched_branch", (), ("mismatched_branch_kernel",), into=SELFTESTS)
def _():
    from . import test_compile_sm90  # the kernel lives beside the test that expects its CompilationError

    test_compile_sm90.launch_mismatched_branch()


if __name__ == "__main__":
    sys.exit(main())
