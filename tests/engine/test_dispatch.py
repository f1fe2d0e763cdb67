"""The engine's kernel path: the quantized linears run act_quant + the block-scaled GEMM op, the MoE
layers the ``fused_moe`` op, attention the ``attention_prefill`` / ``attention_decode`` ops, all
through the model's dispatcher.

On a CPU (the ops' torch references) the logits must be bit-identical to the per-op path the
engine computed before it called those ops, re-written here from the :mod:`quantkit.formats`
references: dequantize(act_quant(x)) @ dequantize(W).T in float32, a per-expert loop of such
linears, and the reference attention per sequence.  With ``TRITON_INTERPRET=1`` (a fresh process)
one tiny model runs every op that has a Triton backend on it; its logits must match the
references' within float32 summation-order error (1e-4 of the largest logit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from quantkit.engine import load
from quantkit.engine import qlinear
from quantkit.engine.layers import attention, mla, moe
from quantkit.engine.qlinear import ActQuant, Fp8Block
from quantkit.formats import fp8_block, mxfp8
from quantkit.kernels.moe import routing as moe_routing
from quantkit.kernels.attention.attention_ref import attend

from .tiny import requantize
from .triton_forward import run

INTERPRETER_TOL = 1e-4  # of max(1, max |logit|): f32 summation order in the GEMMs and softmax


def _legacy_linear(x, w, bias=None, expert=None):
    """The engine's linear before the GEMM ops: quantize-dequantize the input, dequantize W, f32 matmul."""
    if w.act is None:
        xq = x.to(torch.float32)
    elif w.act.kind == "fp8-block":
        xq = fp8_block.dequantize_act(*fp8_block.quantize_act(x, w.act.scale_fmt, w.act.rule))
    else:
        xq = mxfp8.dequantize(*mxfp8.quantize(x, w.act.rule))
    b = None if bias is None else (bias if expert is None else bias[expert]).to(torch.float32)
    return F.linear(xq, w.dequant(expert), b).to(x.dtype)


def _legacy_attend_batch(layer, batch, cache, q, new, expand, *, scale, sinks=None, window=None, ops=None):
    """The engine's attention before the attention ops: the reference attend, sequence by sequence."""
    expand = expand or (lambda c: (c["k"], c["v"]))
    if cache is not None and new is not None:  # None: written with the rotation (rope_cache_write)
        cache.write(layer, batch.slot_mapping, new)
    out = []
    for b, (s, e) in enumerate(batch.segments()):
        if cache is None:
            ctx, k_pos = {n: t[s:e] for n, t in new.items()}, batch.positions[s:e]
        else:
            slots = batch.context_slots(b)
            ctx, k_pos = cache.read(layer, slots), torch.arange(slots.shape[0])
        k, v = expand(ctx)
        out.append(attend(q[s:e], k, v, batch.positions[s:e], k_pos, scale, sinks, window))
    return torch.cat(out).to(q.dtype)


CASES = [("gpt-oss", "mxfp8"), ("qwen3-moe", "mxfp8"), ("deepseek-v3", "fp8-block"), ("gpt-oss", "mxfp4")]


@pytest.mark.parametrize(("kind", "fmt"), CASES)
def test_torch_ops_equal_previous_path(tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, fmt: str) -> None:
    q, _ = requantize(tiny(kind), tmp_path / fmt, fmt, mxfp4_experts_only=fmt == "mxfp4")
    model = load(q, "cpu", torch.float32, backend="torch")
    got = run(model)
    assert set(model.ops.ran.values()) == {"torch"}
    assert "attention_prefill" in model.ops.ran  # MLA prefills through it (ragged expanded keys)
    assert ("attention_decode" in model.ops.ran) == (kind != "deepseek-v3")
    assert ("mla_decode" in model.ops.ran) == (kind == "deepseek-v3")  # MLA decodes absorbed
    experts = [layer.mlp.experts for layer in model.layers if hasattr(layer.mlp, "experts")]
    if fmt == "mxfp8":  # quantized experts with quantized activations: the fused op, not the loop
        assert {e.path for e in experts} == {"fused_moe"} and {"gemm_mxfp8", "fused_moe"} <= set(model.ops.ran)
    else:
        assert all(e.path.startswith("per-expert loop") for e in experts) and "fused_moe" not in model.ops.ran
    for mod in (qlinear, moe):
        monkeypatch.setattr(mod, "linear", _legacy_linear)
    for mod in (attention, mla):
        monkeypatch.setattr(mod, "attend_batch", _legacy_attend_batch)
    monkeypatch.setattr(moe.Experts, "forward", moe.Experts.loop)
    legacy = load(q, "cpu", torch.float32)
    want = run(legacy)
    assert not set(legacy.ops.ran) & {"gemm_mxfp8", "gemm_fp8_block", "fused_moe", "attention_prefill", "attention_decode"}
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w), (g - w).abs().max().item()


def _fp8_experts(gen: torch.Generator, e: int, n: int, k: int, act: ActQuant) -> Fp8Block:
    return Fp8Block(*fp8_block.quantize_weight(0.1 * torch.randn(e, n, k, generator=gen)), act)


@pytest.mark.parametrize("inter", [128, 32])
def test_fp8_block_experts_stack_gate_up(gen: torch.Generator, inter: int) -> None:
    act = ActQuant("fp8-block", "ue8m0", "rceil")
    g, u, d = (_fp8_experts(gen, 4, n, k, act) for n, k in ((inter, 64), (inter, 64), (64, inter)))
    experts = moe.Experts(d, gate=g, up=u)
    x = torch.randn(9, 64, generator=gen)
    w, idx = moe.route(torch.randn(9, 4, generator=gen), moe.Routing("softmax_topk", 2, True))
    want = torch.zeros(9, 64)
    for t in range(9):  # per token, per chosen expert: the quantized linears written out
        for j in range(2):
            ex = int(idx[t, j])
            h = F.silu(_legacy_linear(x[t : t + 1], g, expert=ex)) * _legacy_linear(x[t : t + 1], u, expert=ex)
            want[t] += _legacy_linear(h, d, expert=ex)[0] * w[t, j]
    got = experts(x, w, idx)
    assert torch.equal(got, experts.loop(x, w, idx))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # the loop adds per expert, not per token
    if inter == 128:
        w13 = experts.fused[0]
        assert experts.path == "fused_moe" and w13.shape == (4, 256, 64)
        assert experts.gate.q.data_ptr() == w13.q.data_ptr() and experts.up.q.data_ptr() == w13.q[:, inter:].data_ptr()
        assert torch.equal(experts.up.q.view(torch.uint8), u.q.view(torch.uint8)) and torch.equal(experts.up.scale_inv, u.scale_inv)
    else:
        assert experts.fused is None and "I=32" in experts.path


ROUTINGS = [
    moe.Routing("topk_softmax", 4),
    moe.Routing("softmax_topk", 3, True),
    moe.Routing("softmax_topk", 3, False),
    moe.Routing("grouped_sigmoid", 4, True, 4, 2, 2.5),
]


@pytest.mark.parametrize("r", ROUTINGS, ids=[f"{r.rule}-{i}" for i, r in enumerate(ROUTINGS)])
def test_routing_identical_to_the_ops(gen: torch.Generator, r: moe.Routing) -> None:
    logits = torch.randn(200, 16, generator=gen)
    logits[:8, :4] = 0.5  # ties
    corr = torch.randn(16, generator=gen) if r.rule == "grouped_sigmoid" else None
    w, i = moe.route(logits, r, corr)
    w2, i2 = moe_routing.route(
        logits, r.rule, r.top_k, norm_topk_prob=r.norm_topk_prob, n_group=r.n_group, topk_group=r.topk_group,
        scaling=r.scaling, correction_bias=corr,
    )  # fmt: skip
    assert torch.equal(i, i2) and torch.equal(w, w2)


def test_triton_interpreter_forward(tiny, tmp_path: Path) -> None:
    """gpt-oss, 2 layers, MXFP8: act_quant, GEMM, RoPE (alone, and with the cache write), the router, fused MoE
    (interleaved SwiGLU + biases), sink attention (prefill paged and ragged, decode) all on Triton's interpreter; ~10 s."""
    q, _ = requantize(tiny("gpt-oss"), tmp_path / "mxfp8", "mxfp8")
    script = Path(__file__).with_name("triton_forward.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(script), str(q)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    ops = ["act_quant_mxfp8", "gemm_mxfp8", "attention_prefill", "rope_rotate", "rope_cache_write", "router_topk", "fused_moe", "attention_decode"]
    assert {op: leaf.split(".")[0] for op, leaf in r["ran"].items()} == dict.fromkeys(ops, "triton")  # ran holds "triton.<kernel>" leaves
    for diff, ref in zip(r["max_abs_diff"], r["max_abs_ref"], strict=True):
        assert diff <= INTERPRETER_TOL * max(1.0, ref), r
    assert all(r["argmax_equal"]), r
