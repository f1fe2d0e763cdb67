"""The dispatch point: op registry, backend choice by device and availability, explicit requests
that fail loudly, and a record of which backend ran."""

from __future__ import annotations

import inspect
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import quantkit.kernels as kernels
from quantkit.formats import fp8_block, mxfp4, mxfp8
from quantkit.kernels import dispatch, triton_numerics
from quantkit.kernels.quant import quant_ref as reference
from quantkit.kernels.dispatch import Availability, BackendUnavailable, Dispatcher, Registry

CONVERSION_OPS = ("mxfp4_decode", "fp8_block_quantize_weight", "mxfp8_quantize", "act_quant_fp8_block", "act_quant_mxfp8")


def test_every_op_has_its_formats_reference_as_torch_backend():
    assert reference.OPS["mxfp4_decode"] is mxfp4.decode
    assert reference.OPS["fp8_block_quantize_weight"] is fp8_block.quantize_weight
    assert reference.OPS["act_quant_fp8_block"] is fp8_block.quantize_act
    assert reference.OPS["mxfp8_quantize"] is reference.OPS["act_quant_mxfp8"] is mxfp8.quantize
    for op, fn in reference.OPS.items():
        assert dispatch.REGISTRY.table(op)[dispatch.REFERENCE].fn is fn


@pytest.mark.parametrize("op", CONVERSION_OPS)
def test_triton_backend_registered_with_the_reference_signature(op):
    """A backend is a drop-in: same positional parameters and defaults as the reference, and its
    keyword-only ones (e.g. ``scale_mn``); launch tuning only as extra keyword-only parameters."""
    assert dispatch.backends(op)[0] == "triton"  # highest priority
    ref = inspect.signature(dispatch.REGISTRY.table(op)["torch"].fn).parameters
    tri = inspect.signature(dispatch.REGISTRY.table(op)["triton"].fn).parameters

    def head(ps):
        return [(p.name, p.default) for p in ps.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]

    assert head(tri) == head(ref)
    for name, p in ref.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            assert name in tri and tri[name].default == p.default, f"{op}: the Triton backend lacks the reference's keyword {name}"


@pytest.mark.parametrize("op", CONVERSION_OPS)
def test_auto_on_cpu_runs_the_reference(op):
    assert dispatch.which(op, "cpu") == "torch"
    assert dispatch.which(op, "cpu", backend="torch") == "torch"


def test_auto_call_on_cpu_matches_reference_and_dispatcher_records_it():
    x = torch.randn(3, 64)
    d = Dispatcher()
    q, s = d.call("mxfp8_quantize", x)
    rq, rs = mxfp8.quantize(x)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    assert d.last_backend("mxfp8_quantize") == "torch"
    with pytest.raises(KeyError, match="has not run"):
        d.last_backend("mxfp4_decode")


def test_triton_on_cpu_only_when_interpreted_and_asked_for(triton_device):
    """auto never picks the interpreter; an explicit request runs it (interpreted CPU run)."""
    a = triton_numerics.available(torch.device("cpu"))
    if triton_device.type == "cuda":  # compiled Triton: CPU is not a target
        assert not a.ok and "CUDA" in a.reason
        with pytest.raises(BackendUnavailable, match="cannot run on cpu"):
            dispatch.which("mxfp8_quantize", "cpu", backend="triton")
    else:
        assert a.ok and not a.auto
        assert dispatch.which("mxfp8_quantize", "cpu", backend="triton") == "triton"
        d = Dispatcher(per_op={"mxfp8_quantize": "triton"})
        d.call("mxfp8_quantize", torch.ones(1, 32))
        assert d.last_backend("mxfp8_quantize") == "triton"


def test_unknown_op_and_unknown_backend_fail_loudly():
    with pytest.raises(KeyError, match="unknown op 'nope'"):
        dispatch.which("nope", "cpu")
    with pytest.raises(BackendUnavailable, match="'no-such' unavailable: not registered.*registered: triton, torch"):
        dispatch.which("mxfp4_decode", "cpu", backend="no-such")


def _private_registry() -> Registry:
    reg = Registry()
    dispatch.register("op", "torch", lambda x: ("torch", x), registry=reg)
    return reg


def test_registry_rules():
    reg = _private_registry()
    with pytest.raises(ValueError, match="registered twice"):
        dispatch.register("op", "torch", lambda x: x, registry=reg)
    with pytest.raises(ValueError, match="register its 'torch' reference before"):
        dispatch.register("other", "fast", lambda x: x, registry=reg)
    with pytest.raises(ValueError, match="not a backend name"):
        dispatch.register("op", "auto", lambda x: x, registry=reg)


def test_auto_picks_the_highest_priority_backend_available_on_the_device():
    reg = _private_registry()
    cuda_only = lambda d: Availability(d.type == "cuda", reason="needs CUDA")  # noqa: E731
    explicit_only = lambda d: Availability(True, auto=False, reason="explicit only")  # noqa: E731
    dispatch.register("op", "fast", lambda x: ("fast", x), available=cuda_only, priority=10, registry=reg)
    dispatch.register("op", "faster", lambda x: ("faster", x), available=explicit_only, priority=20, registry=reg)
    assert reg.resolve("op", "cpu").name == "torch"
    assert reg.resolve("op", "cuda").name == "fast"
    assert reg.resolve("op", "cpu", "faster").name == "faster"
    with pytest.raises(BackendUnavailable, match="'fast' cannot run on cpu: needs CUDA"):
        reg.resolve("op", "cpu", "fast")
    d = Dispatcher(registry=reg)
    assert d.call("op", torch.zeros(1))[0] == "torch" and d.last_backend("op") == "torch"
    assert d.call("op", torch.zeros(1), backend="faster")[0] == "faster" and d.last_backend("op") == "faster"
    assert d.which("op", "cuda") == "fast"


def test_missing_backend_reason_is_reported():
    reg = _private_registry()
    dispatch.register_missing("triton", "triton is not importable (No module named 'triton')", registry=reg)
    with pytest.raises(BackendUnavailable, match="No module named 'triton'"):
        reg.resolve("op", "cpu", "triton")


def test_call_needs_a_tensor_argument():
    with pytest.raises(TypeError, match="no tensor argument"):
        dispatch.call("mxfp4_decode", None, None)


def test_kernels_package_reads_no_environment_variables():
    """Environment variables are read at the edge only (Triton reads TRITON_INTERPRET itself)."""
    root = pathlib.Path(kernels.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"os\.environ|getenv|os\.putenv", text), f"{path.name} reads the environment"


def test_without_triton_the_reference_runs_and_triton_requests_say_why():
    """A machine without triton: import works, auto runs torch, backend="triton" names the import error."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from quantkit.kernels import dispatch\n"
        "q, s = dispatch.call('mxfp8_quantize', torch.ones(2, 32))\n"
        "assert dispatch.which('mxfp8_quantize', 'cpu') == 'torch'\n"
        "try:\n"
        "    dispatch.which('mxfp8_quantize', 'cpu', backend='triton')\n"
        "except dispatch.BackendUnavailable as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "triton is not importable" in out.stdout


def test_device_capability_is_asked_once_per_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: calls.append(index) or (9, 0))
    dispatch._capability.cache_clear()
    try:
        assert [dispatch.capability(torch.device("cuda", 1)) for _ in range(3)] == [(9, 0)] * 3
        assert calls == [1]
    finally:
        dispatch._capability.cache_clear()


def test_sm_count_is_asked_once_per_device(monkeypatch):
    from types import SimpleNamespace

    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: calls.append(index) or SimpleNamespace(multi_processor_count=132))
    dispatch._sm_count.cache_clear()
    try:
        assert [dispatch.sm_count(torch.device("cuda", 1)) for _ in range(3)] == [132] * 3
        assert calls == [1]
        assert dispatch.sm_count(torch.device("cpu")) == 8 and calls == [1]  # the interpreter's grids: no driver asked
    finally:
        dispatch._sm_count.cache_clear()


def _selecting_registry() -> tuple[Registry, list]:
    """An op with a reference and a backend of two leaves, chosen by the rows of its input."""
    reg, calls = Registry(), []
    dispatch.register("double", dispatch.REFERENCE, lambda x: 2 * x, registry=reg)

    def leaf(name):
        return lambda x: calls.append(name) or 2 * x

    def select(x):
        wide = x.shape[0] > 4
        return dispatch.Choice("fast.wide" if wide else "fast.narrow", config=8 if wide else None,
                               reason="more than 4 rows fill the tiles" if wide else "few rows", run=leaf("wide" if wide else "narrow"))  # fmt: skip

    dispatch.register("double", "fast", lambda x: pytest.fail("a selecting backend runs its choice"), priority=1, select=select, registry=reg)
    return reg, calls


def test_a_selecting_backend_runs_its_leaf_and_the_dispatcher_names_it():
    reg, calls = _selecting_registry()
    ops = Dispatcher(registry=reg)
    x = torch.ones(8)
    assert torch.equal(ops.call("double", x), 2 * x) and calls == ["wide"]
    assert ops.ran["double"] == "fast.wide"
    assert torch.equal(ops.call("double", x[:2]), 2 * x[:2]) and calls == ["wide", "narrow"]
    assert ops.ran["double"] == "fast.narrow"
    c = ops.choose("double", x)
    assert (c.kernel, c.config, c.reason, str(c)) == ("fast.wide", 8, "more than 4 rows fill the tiles", "fast.wide [8]")
    assert ops.which("double", "cpu") == "fast" and ops.which("double", x[:1]) == "fast.narrow"
    assert calls == ["wide", "narrow"]  # choosing runs nothing
    assert Dispatcher(backend="torch", registry=reg).which("double", x) == "torch"


def test_which_given_the_operands_names_the_leaf_and_a_single_kernel_backend_its_name():
    x = torch.randn(2, 64)
    assert dispatch.which("act_quant_mxfp8", "cpu") == dispatch.which("act_quant_mxfp8", x, "floor") == "torch"
    assert dispatch.choose("act_quant_mxfp8", x, "floor") == dispatch.Choice("torch", reason="the backend's only kernel")


def test_targets_of_devices_and_named_ones():
    cpu = dispatch.target("cpu")
    assert (cpu.type, cpu.capability, cpu.optional) == ("cpu", (0, 0), None)
    h200 = dispatch.TARGETS["h200"]
    assert h200.capability == (9, 0) and h200.sms == 132 and h200.has("deepgemm") and not h200.has("cutlass")
    assert not cpu.has("deepgemm")  # no device or op given: nothing optional is assumed


def test_the_kernel_map_command(tmp_path):
    """`quantkit kernels`: every map row names a kernel and the rule that chose it; a bad device or op is one clear error."""
    from click.testing import CliRunner

    from quantkit.cli import main

    r = CliRunner().invoke(main, ["kernels", "--device", "h200", "--json"])
    assert r.exit_code == 0, r.output
    rows = __import__("json").loads(r.output)
    assert {"gemm_fp8_block", "gemm_mxfp8", "fused_moe", "attention_prefill", "attention_decode", "mla_decode"} <= {row["op"] for row in rows}
    for row in rows:
        assert row["op"] in dispatch.ops() and row["kernel"] and row["reason"], row
    r = CliRunner().invoke(main, ["kernels", "--device", "cpu"])
    assert r.exit_code == 0 and "| op | case | M | kernel |" in r.output and "mxfp4_decode: triton, torch*" in r.output, r.output
    for args, msg in ((["--device", "tpu9"], "neither a torch device nor a named target"), (["--op", "nope"], "unknown op(s) nope")):
        r = CliRunner().invoke(main, ["kernels", *args])
        assert r.exit_code == 2 and msg in r.output, r.output
