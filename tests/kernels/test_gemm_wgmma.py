"""The warp-specialised Hopper FP8-block GEMM (quantkit/kernels/gemm/wgmma.py) and the fused
MoE's sorted-row GEMMs built from it (fused_moe_sorted.sorted_gemm_wgmma).

Gluon kernels do not run in Triton's CPU interpreter, so CI checks what it can without a GPU:
the rules that decide where the kernel runs (tests/kernels/test_gemm_select.py: where the selection sends it), and the
kernel compiled for sm_90 by the installed Triton and its ptxas: the warp-specialised structure
is there, the promotion overlaps the tensor core (``wgmma.wait_group 1``), and ptxas neither
serialises the wgmma pipeline (its C7514 / C7517 diagnostics) nor spills more than a few
registers.  The numbers are checked on the H200 by tests/kernels/test_gemm.py's GPU tests (the
table and every config against the dequantizing reference; test_fused_moe.py's for the MoE
kernel) and timed by quantkit bench kernels and quantkit bench sweep-moe-prefill --wgmma.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from quantkit.formats import fp8_block
from quantkit.kernels.gemm.block_scaled import Side
from quantkit.kernels import dispatch
from quantkit.kernels.gemm.fp8_block import gemm_fp8_block
from quantkit.kernels.gemm.wgmma import CONSUMER_REGS, LOADER_REGS, WgmmaConfig, gluon_missing, wgmma_available, why_not


def sides(m: int, n: int, k: int, kps: int = 128) -> tuple[Side, Side]:
    a = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    w = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    return Side(a, torch.ones(m, -(-k // kps)), 1, kps), Side(w, torch.ones(-(-n // 128), -(-k // 128)), 128, 128)


def test_not_available_on_the_cpu_or_in_the_interpreter():
    avail = wgmma_available(torch.device("cpu"))
    assert not avail.ok and ("interpreter" in avail.reason or "NVIDIA GPU" in avail.reason)


def test_why_not_names_each_rule():
    a, w = sides(1024, 256, 2880)
    assert "1x128 activation and 128x128 weight" in why_not(*sides(1024, 256, 2880, kps=32), torch.bfloat16)
    assert "F32 scales" in why_not(a._replace(s=a.s.to(torch.uint8)), w, torch.bfloat16)
    assert "output must be one of" in why_not(a, w, torch.int32)
    unaligned = sides(1024, 256, 200)  # 200-byte rows
    assert "16-byte aligned" in why_not(*unaligned, torch.bfloat16)
    # operands the kernel takes: what is left is this machine
    assert why_not(a, w, torch.bfloat16) == wgmma_available(a.q.device).reason


def test_explicit_config_raises_with_the_rule(gen):
    """CPU operands, called directly (the dispatcher would refuse the device first on a CUDA machine)."""
    x = torch.randn(600, 256, generator=gen)
    a, sa = fp8_block.quantize_act(x)
    q, sw = fp8_block.quantize_weight(torch.randn(128, 256, generator=gen))
    with pytest.raises(ValueError, match=r"gemm_fp8_block wgmma128x128/st5/u4: .*(interpreter|NVIDIA GPU)"):
        gemm_fp8_block(a, sa, q, sw, config=WgmmaConfig())


def test_pick_block_n_fills_the_sms():
    from quantkit.kernels.gemm.wgmma import pick_block_n

    # M = 64, N = 4096 on 132 SMs: 32 / 64 / 128 tiles of 128 / 64 / 32 columns, one wave each: the fullest wins
    assert pick_block_n(64, 4096, 132) == 32
    # M = 128, N = 7168: 56 / 112 / 224 tiles: 1 / 1 / 2 waves, 112 fills more of its wave than 56
    assert pick_block_n(128, 7168, 132) == 64
    # M = 1024, N = 7168: 448 tiles (4 waves) at 128 columns against 7 and 14 waves: wide tiles stay
    assert pick_block_n(1024, 7168, 132) == 128


def test_ring_stages_keep_a_depth_that_fits():
    from quantkit.kernels.gemm.wgmma import ring_stages

    # [64, bn] x 2 staging + (128 + bn) x 128 bytes a stage within 232448 bytes
    assert [ring_stages(8, bn, 2) for bn in (128, 64, 32)] == [5, 8, 8]
    assert ring_stages(5, 128, 4) == 5, "the large-M row's 5 stages with float32 out fit (229376 bytes): kept"
    assert ring_stages(10, 32, 2) == 10 and ring_stages(12, 32, 2) == 10


def test_config_names():
    assert WgmmaConfig(block_n=0).name() == "wgmma128xauto/st5/u4" and WgmmaConfig(block_n=32, stages=8).name() == "wgmma128x32/st8/u4"
    assert WgmmaConfig().name() == "wgmma128x128/st5/u4"
    assert WgmmaConfig(stages=4, unroll=2, group=16).name() == "wgmma128x128/st4/u2/g16"
    assert WgmmaConfig(split_k=0).name() == "wgmma128x128/st5/u4/sauto" and WgmmaConfig(split_k=2).name() == "wgmma128x128/st5/u4/s2"


# Run in a fresh interpreter: this session's Triton may be in interpreter mode (conftest.py), in
# which Gluon's own jit helpers cannot be compiled.  Compiling for sm_90 needs no GPU.
_BUILD = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from quantkit.kernels.gemm import wgmma_gluon as gemm_wgmma_gluon
from quantkit.kernels.moe import wgmma_gluon as gemm_wgmma_moe_gluon

out, spec = sys.argv[1], json.loads(sys.argv[2])
fn = getattr(gemm_wgmma_moe_gluon if spec["fn"].startswith("moe_") else gemm_wgmma_gluon, spec["fn"])
dt = {"fp8e4nv": gl.float8e4nv, "bf16": gl.bfloat16}
def ty(t):
    if isinstance(t, list):  # a TMA descriptor: [dtype, rows, cols]
        lay = gl.NVMMASharedLayout.get_default_for([t[1], t[2]], dt[t[0]])
        return f"tensordesc<{t[0]}[{t[1]}, {t[2]}],{lay!r}>"
    return t
consts = spec["consts"]
sig = {a: "constexpr" if a in consts else ty(spec["types"].get(a, "i32")) for a in fn.arg_names}
attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a].startswith("*")}
src = GluonASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(c),): v for c, v in consts.items()}, attrs=attrs)
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
open(out, "w").write(kernel.asm["ptx"])
print(json.dumps({"num_warps": kernel.metadata.num_warps, "ptxas": get_ptxas(90).path}))
"""


def _build_sm90(tmp_path, fn: str, consts: dict, types: dict) -> tuple[str, dict, str]:
    """The kernel's sm_90 PTX, build facts (num_warps, Triton's ptxas for sm_90) and ptxas's report on it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ptx = tmp_path / "k.ptx"
    spec = json.dumps({"fn": fn, "consts": consts, "types": types})
    res = subprocess.run([sys.executable, "-c", _BUILD, str(ptx), spec], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    facts = json.loads(res.stdout.strip().splitlines()[-1])
    cmd = [facts["ptxas"], "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(tmp_path / "k.cubin")]
    rep = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert rep.returncode == 0, rep.stderr[-2000:]
    return ptx.read_text(), facts, rep.stderr


def _assert_pipelined(ptx: str, facts: dict, report: str) -> None:
    assert "wgmma.wait_group.sync.aligned 1;" in ptx or "wgmma.wait_group.sync.aligned 2;" in ptx, "promotion must overlap the next wgmma"
    assert "setmaxnreg" in ptx, "warp specialisation: the TMA warp gives its registers to the consumers"
    assert facts["num_warps"] == 12, "two consumer warpgroups + the TMA warp's group"
    assert "C7514" not in report and "C7517" not in report, f"ptxas serialised the wgmma pipeline: {report[-1500:]}"
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", report)]
    # a few registers' worth at most: Triton 3.6 on the H200 builds these without spills, newer
    # Triton / ptxas versions have spilled up to 32 bytes in the MoE epilogue
    assert spills and max(spills) <= 64, report[-1500:]


@pytest.mark.skipif(gluon_missing() is not None, reason="the installed Triton has no Gluon Hopper API")
@pytest.mark.parametrize("tma_store,bias,split_k,bn", [(True, True, False, 128), (False, False, False, 128), (True, False, True, 128),
                                                      (False, True, True, 128), (True, False, False, 32), (True, True, True, 64)])
def test_sm90_build_overlaps_the_promotion_without_serialising(tmp_path, tma_store, bias, split_k, bn):
    cfg = WgmmaConfig()
    consts = {"BM": 128, "BN": bn, "BK": 128, "STAGES": cfg.stages, "UNROLL": cfg.unroll, "GROUP": cfg.group, "REGS": cfg.regs,
              "LOADER_REGS": LOADER_REGS, "HAS_BIAS": bias, "TMA_STORE": tma_store, "SPLIT_K": split_k}  # fmt: skip
    if not tma_store:
        consts["c_desc"] = None
    types = {"as_ptr": "*fp32", "ws_ptr": "*fp32", "bias_ptr": "*bf16", "c_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32",
             "a_desc": ["fp8e4nv", 128, 128], "w_desc": ["fp8e4nv", bn, 128], "c_desc": ["bf16", 64, bn]}  # fmt: skip
    ptx, facts, report = _build_sm90(tmp_path, "fp8_block_gemm_ws", consts, types)
    assert f"n{bn}k32" in ptx, f"wgmma instructions {bn} columns wide"
    _assert_pipelined(ptx, facts, report)
    assert ptx.count("wgmma.mma_async") >= 4 * 4, "UNROLL=4 groups of 128-deep blocks, 4 k32 wgmma each"
    assert ("cp.async.bulk.tensor.2d.global.shared" in ptx) == tma_store, "TMA-store epilogue exactly when asked"
    assert bool(re.search(r"atom\.global\.(gpu\.)?acq_rel\.add", ptx)) == split_k, "split-K arrives on an acq_rel counter"


@pytest.mark.skipif(gluon_missing() is not None, reason="the installed Triton has no Gluon Hopper API")
@pytest.mark.parametrize("gated,halves,bias", [(True, False, True), (True, True, False), (False, False, True)], ids=["gpt-oss-gate-up", "concat-gate-up", "down"])
@pytest.mark.parametrize("bm", [64, 128])
def test_sm90_moe_build_overlaps_the_promotion_without_serialising(tmp_path, gated, halves, bias, bm):
    """The sorted-row MoE kernel as fused_moe_sorted.sorted_gemm_wgmma launches it (concatenated halves: groups of 2)."""
    split = bm == 64
    consts = {"BM": bm, "BN_WG": 64 if gated else 128, "BK": 128, "STAGES": 5, "UNROLL": 2 if halves else 4, "GROUP": 8, "REGS": CONSUMER_REGS,
              "LOADER_REGS": LOADER_REGS, "GATED": gated, "HALVES": halves, "HAS_BIAS": bias, "ROUND": True, "ACT": 0 if halves else 1,
              "SPLIT_N": split}  # fmt: skip
    types = {"as_ptr": "*fp32", "ws_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "sorted_ptr": "*i32", "expert_ptr": "*i32",
             "npad_ptr": "*i32", "alpha": "fp32", "limit": "fp32", "a_desc": ["fp8e4nv", bm, 128],
             "w_desc": ["fp8e4nv", 64 if halves else 256 if split else 128, 128]}  # fmt: skip
    ptx, facts, report = _build_sm90(tmp_path, "moe_gemm_ws", consts, types)
    _assert_pipelined(ptx, facts, report)


def test_selected_launch_skips_the_rules_an_explicit_config_asks_them(gen, monkeypatch):
    """A wgmma launch the selection chose does not ask :func:`why_not` again (5 us of host time a call); an explicit
    config does (test_explicit_config_raises_with_the_rule: it raises with the rule)."""
    from quantkit.kernels.gemm import fp8_block as mod
    from quantkit.kernels.gemm import select

    launched = []
    monkeypatch.setattr(select, "device_target", lambda device: dispatch.Target("cuda", (9, 0), 132, "sm_90", frozenset({"wgmma"})))
    monkeypatch.setattr(mod, "wgmma_mm", lambda a, w, bias, out_dtype, cfg, checked=False, workspace=None: launched.append(checked) or
                        torch.zeros(a.q.shape[0], w.q.shape[0], dtype=out_dtype))  # fmt: skip
    a, sa = fp8_block.quantize_act(torch.randn(600, 256, generator=gen))
    q, sw = fp8_block.quantize_weight(torch.randn(128, 256, generator=gen))
    c = select.choose_fp8_block(a, sa, q, sw, backend="triton")
    assert c.kernel == "triton.wgmma"
    c.run(a, sa, q, sw)
    select.choose_fp8_block(a, sa, q, sw, config=WgmmaConfig(), backend="triton").run(a, sa, q, sw)
    assert launched == [True, False]
