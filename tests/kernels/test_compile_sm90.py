"""Every Triton kernel the ops' launchers launch on an H200, compiled for sm_90 here, without a GPU.

The CPU suite runs the kernels in Triton's interpreter, which does not type-check them as the compiler does: a kernel
that binds one name to a [BH, 1] tensor in one branch of a runtime ``if`` and to a [BH] tensor in the other runs in
the interpreter and fails to compile on the GPU ("Mismatched type for h between then block ... and else block").  So
:mod:`.sm90_launches` runs each op's Triton launcher (the backend registered as ``"triton"``, through its selection
to the leaf it picks, as on the H200: sm_90, 132 SMs, PDL, hardware E4M3 casts, TMA, the Gluon wgmma kernels) on
small CPU tensors, captures every launch with Triton's own binder instead of launching it, and compiles each distinct
(kernel, signature, constexprs, attributes, options) with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``,
ptxas included.  It runs in a fresh process without ``TRITON_INTERPRET`` (tests/conftest.py sets it for this one).

Compiled kernels land in Triton's cache (``TRITON_CACHE_DIR``), so a second run only re-checks what changed; a
kernel that fails is never cached.  Cold, the whole file takes about 70 s on 2 idle cores (some 125 compiles).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from .sm90_launches import SCENARIOS

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SELFTEST = "selftest_mismatched_branch"

# (scenario, kernel) -> (what its error says, why): launches that do not compile for sm_90 with the Triton here.  The
# scenario's test xfails while its only failures are these; any other failure in it fails the test.
KNOWN_FAILURES: dict[tuple[str, str], tuple[str, str]] = {}


# ---- the self-test: a kernel the interpreter runs and the compiler refuses ------------------------------------


@triton.jit
def mismatched_branch_kernel(x_ptr, out_ptr, n, BH: tl.constexpr):
    """``h`` is [BH, 1] in one branch of a runtime ``if`` and [BH] in the other: fine in the interpreter, a
    CompilationError ("Mismatched type for h") when compiled."""
    offs = tl.arange(0, BH)
    if n > BH:
        h = offs[:, None]
    else:
        h = offs
    tl.store(out_ptr + h, tl.load(x_ptr + h, mask=h < n) * 2, mask=h < n)


def launch_mismatched_branch() -> torch.Tensor:
    x = torch.arange(16, dtype=torch.float32)
    out = torch.zeros_like(x)
    mismatched_branch_kernel[(1,)](x, out, x.numel(), BH=16)
    return out


# the runner: the helper imported as part of this test package, in a process of its own
_RUNNER = """
import importlib, importlib.util, sys
here = sys.argv[1]
spec = importlib.util.spec_from_file_location("sm90_tests", here + "/__init__.py", submodule_search_locations=[here])
pkg = importlib.util.module_from_spec(spec)
sys.modules["sm90_tests"] = pkg
spec.loader.exec_module(pkg)
sys.exit(importlib.import_module("sm90_tests.sm90_launches").main(sys.argv[2:]))
"""


def _requested(request: pytest.FixtureRequest) -> list[str]:
    """The scenarios this session's selected tests ask about (all when the module runs whole)."""
    names = set()
    for item in request.session.items:
        if getattr(item, "module", None) is request.module and hasattr(item, "callspec"):
            names.add(item.callspec.params.get("name"))
    names.discard(None)
    return [n for n in SCENARIOS if n in names or not names] + [SELFTEST]


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("sm90") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    jobs = max(1, min(4, os.cpu_count() or 1))
    cmd = [sys.executable, "-c", _RUNNER, str(HERE), "--out", str(out), "--jobs", str(jobs), "--only", ",".join(_requested(request))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, f"the sm_90 compile run failed:\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def _failures(rep: dict, name: str) -> list[dict]:
    return [rep["compiles"][i] for i in rep["scenarios"][name]["compiles"] if rep["compiles"][i]["status"] != "ok"]


def _show(c: dict) -> str:
    launch = c["launch"]
    return f"{c['where']} const={launch['const']} opts={launch['opts']}\n{c['error']}"


def test_every_triton_op_has_a_scenario():
    """A new op with a Triton backend needs a scenario in sm90_launches.py, else its kernels go uncompiled."""
    from quantkit.kernels import dispatch

    triton_ops = {op for op, table in dispatch.REGISTRY.ops.items() if "triton" in table}
    covered = {op for s in SCENARIOS.values() for op in s.ops}
    assert triton_ops <= covered, f"ops whose Triton kernels no scenario compiles: {sorted(triton_ops - covered)}"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_launched_kernels_compile_for_sm90(report: dict, name: str):
    sc = report["scenarios"][name]
    assert sc["error"] is None, f"{name}: the launcher failed before launching everything:\n{sc['error']}"
    launched = {report["compiles"][i]["kernel"] for i in sc["compiles"]}
    missing = set(SCENARIOS[name].kernels) - launched
    assert not missing, f"{name}: expected launches of {sorted(missing)}, got {sorted(launched)}"
    failed = _failures(report, name)
    unknown = [c for c in failed if KNOWN_FAILURES.get((name, c["kernel"]), ("\0",))[0] not in c["error"]]
    assert not unknown, f"{name}: {len(unknown)} of {len(sc['compiles'])} launches do not compile for sm_90:\n\n" + "\n\n".join(
        _show(c) for c in unknown
    )
    if failed:
        pytest.xfail(f"{len(failed)} of {len(sc['compiles'])} launches: " + "; ".join(sorted({KNOWN_FAILURES[(name, c["kernel"])][1] for c in failed})))


def test_a_compile_error_is_reported_not_skipped(report: dict):
    """The mismatched-branch kernel above runs in the interpreter; compiled for sm_90 it must fail, and be reported."""
    sc = report["scenarios"][SELFTEST]
    assert sc["error"] is None, sc["error"]
    (c,) = [report["compiles"][i] for i in sc["compiles"]]
    assert c["kernel"] == "mismatched_branch_kernel"
    assert c["status"] == "error" and "CompilationError" in c["error"] and "Mismatched type for h" in c["error"], c


def test_the_self_test_kernel_runs_in_the_interpreter(triton_device):
    """What makes the self-test a fair one: the interpreter accepts the kernel (here, where it is interpreted)."""
    if triton_device.type != "cpu":
        pytest.skip("compiled Triton here: the kernel cannot run")
    assert torch.equal(launch_mismatched_branch(), torch.arange(16, dtype=torch.float32) * 2)
