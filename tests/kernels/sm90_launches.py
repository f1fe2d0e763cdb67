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


from . import sm90_scenarios  # noqa: E402,F401  (registers the scenarios into SCENARIOS / SELFTESTS)


if __name__ == "__main__":
    sys.exit(main())
