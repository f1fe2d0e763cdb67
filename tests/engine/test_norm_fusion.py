"""The input norms fused with the projections' activation quantization (q/k/v; MLA: q_a or q with
kv_a, then q_a_layernorm with q_b; a dense MLP's gate/up) (``rmsnorm_act_quant``, :func:`quantkit.engine.layers.norm.norm_quantized`):
used where every projection quantizes alike and activations are bf16, off otherwise; its bytes against
the unfused norm + act_quant, and a whole model's logits with and without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quantkit.engine import load
from quantkit.engine.layers import attention as attention_mod
from quantkit.engine.layers import mla as mla_mod
from quantkit.engine.layers import mlp as mlp_mod
from quantkit.engine.layers.norm import RMSNorm, norm_quantized
from quantkit.engine.qlinear import ActQuant
from quantkit.formats import fp8_block, mxfp8

from .tiny import requantize
from .triton_forward import run


class _W:  # a projection's weight as norm_quantized sees it
    def __init__(self, act, ops=None):
        from quantkit.kernels.dispatch import Dispatcher

        self.act, self.ops = act, ops or Dispatcher("torch")


class _Proj:
    def __init__(self, act):
        self.weight = _W(act)


@pytest.mark.parametrize("act", [ActQuant("fp8-block"), ActQuant("fp8-block", "ue8m0", "rceil"), ActQuant("mxfp8", rule="floor")], ids=str)
@pytest.mark.parametrize("order", ["hf", "f32"])
def test_fused_bytes_match_norm_then_act_quant(act, order):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(257, 1024, generator=g) * 3).to(torch.bfloat16)
    w = (torch.rand(1024, generator=g) + 0.5).to(torch.float32 if order == "f32" else torch.bfloat16)  # GPT-OSS keeps float32 norm weights
    norm = RMSNorm(w, 1e-6, order)
    q, s = norm_quantized(norm, [_Proj(act)] * 3, x)
    h = norm(x)
    rq, rs = fp8_block.quantize_act(h, act.scale_fmt, act.rule) if act.kind == "fp8-block" else mxfp8.quantize(h, act.rule)
    codes, ref = q.view(torch.uint8).to(torch.int32), rq.view(torch.uint8).to(torch.int32)
    # the fused norm sums squares in a specified order: a bf16 ulp on a few elements, then at most one E4M3 step
    assert (codes != ref).float().mean().item() <= 1e-3
    assert ((codes & 0x7F) - (ref & 0x7F)).abs().max().item() <= 1
    assert (s != rs).float().mean().item() <= 1e-2


def test_not_fused_when_projections_differ_or_float32():
    x = torch.randn(4, 256)
    norm = RMSNorm(torch.ones(256), 1e-6)
    assert norm_quantized(norm, [_Proj(ActQuant("fp8-block"))] * 3, x) is None  # float32 activations
    xb, nb = x.to(torch.bfloat16), RMSNorm(torch.ones(256, dtype=torch.bfloat16), 1e-6)
    assert norm_quantized(nb, [_Proj(ActQuant("fp8-block")), _Proj(None), _Proj(ActQuant("fp8-block"))], xb) is None
    assert norm_quantized(nb, [_Proj(ActQuant("fp8-block")), _Proj(ActQuant("fp8-block", "ue8m0"))], xb) is None
    assert norm_quantized(nb, [_Proj(ActQuant("mxfp8"))] * 3, xb) is not None


@pytest.mark.parametrize(("kind", "fmt"), [("qwen3", "fp8-block"), ("gpt-oss", "mxfp8"), ("deepseek-v3", "fp8-block")])
def test_model_logits_with_and_without_the_fused_norm(tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, fmt: str) -> None:
    q, _ = requantize(tiny(kind), tmp_path / fmt, fmt)
    fused_model = load(q, "cpu", torch.bfloat16, backend="torch")
    fused = run(fused_model)
    assert "rmsnorm_act_quant" in fused_model.ops.ran
    monkeypatch.setattr(attention_mod, "norm_quantized", lambda *a: None)
    monkeypatch.setattr(mla_mod, "norm_quantized", lambda *a: None)
    monkeypatch.setattr(mlp_mod, "norm_quantized", lambda *a: None)
    plain_model = load(q, "cpu", torch.bfloat16, backend="torch")
    plain = run(plain_model)
    assert "rmsnorm_act_quant" not in plain_model.ops.ran
    for f, p in zip(fused, plain, strict=True):
        assert (f - p).abs().max().item() <= 0.05 * max(1.0, p.abs().max().item())
    f32 = load(q, "cpu", torch.float32, backend="torch")
    run(f32)
    assert "rmsnorm_act_quant" not in f32.ops.ran  # float32 keeps the unfused path (exact against transformers)


def test_dense_mlp_fuses_its_input_norm() -> None:
    """A dense MLP's forward_normed: one rmsnorm_act_quant for gate / up in bf16 (close to norm then the
    projections' own quantization), exactly forward(norm(x)) in float32."""
    from quantkit.engine.layers.mlp import MLP
    from quantkit.engine.qlinear import Fp8Block, Linear

    gen = torch.Generator().manual_seed(41)

    def proj(n: int, k: int) -> Linear:
        return Linear(Fp8Block(*fp8_block.quantize_weight(torch.randn(n, k, generator=gen) / k**0.5), ActQuant("fp8-block")))

    mlp = MLP(proj(256, 192), proj(256, 192), proj(192, 256))
    norm = RMSNorm(1 + 0.1 * torch.randn(192, generator=gen), 1e-6, "f32")
    x = torch.randn(5, 192, generator=gen)
    assert torch.equal(mlp.forward_normed(norm, x), mlp(norm(x)))  # float32: no fused op
    assert "rmsnorm_act_quant" not in mlp.gate_proj.weight.ops.ran
    xb = x.to(torch.bfloat16)
    fused, plain = mlp.forward_normed(norm, xb), mlp(norm(xb))
    assert mlp.gate_proj.weight.ops.ran["rmsnorm_act_quant"] == "torch"
    assert (fused.float() - plain.float()).abs().max().item() <= 0.05 * plain.float().abs().max().item()


def test_mn_major_activation_scales_same_logits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """DeepSeek-V3 (ragged: partial 128-groups, MLA, shared and routed experts) served with fp8-block scales
    written MN-major (the GPU default): every quantizer the engine calls writes that layout, and the
    logits are those of the row-major run, bit for bit."""
    from quantkit.synth import synthesize

    synthesize("deepseek-v3", tmp_path / "ds", preset="tiny-ragged")
    ids = torch.arange(1, 60, 4)
    with torch.no_grad():
        row = load(tmp_path / "ds", "cpu", torch.bfloat16)(ids)
    seen = []
    real = fp8_block.act_scales_mn
    monkeypatch.setattr(fp8_block, "act_scales_mn", lambda s: seen.append(tuple(s.shape)) or real(s))
    model = load(tmp_path / "ds", "cpu", torch.bfloat16, scale_mn=True)
    with torch.no_grad():
        mn = model(ids)
    assert {"rmsnorm_act_quant", "silu_mul_act_quant"} <= set(model.ops.ran), model.ops.ran
    assert len(seen) >= 3, f"the quantizers wrote MN-major scales {len(seen)} times"
    assert torch.equal(mn, row), (mn - row).abs().max().item()
    with pytest.raises(ValueError, match="MN-major activation scales are an fp8-block layout, not mxfp8"):
        ActQuant("mxfp8", scale_mn=True)


@pytest.mark.parametrize("kind", ["deepseek-v3", "qwen3-moe", "gpt-oss"])
def test_gemm_shapes_cover_every_quantized_gemm_the_model_runs(tiny, tmp_path: Path, kind: str):
    """What ``prepare_kernels`` compiles ahead: every (N, K) the forward hands the fp8-block GEMM op (fused
    row groups included), and on a CPU nothing is built."""
    src, _ = requantize(tiny(kind), tmp_path / "q", "fp8-block")
    model = load(src, "cpu", torch.bfloat16)
    seen = set()
    call = model.ops.call

    def recording(op, *args, **kw):
        if op == "gemm_fp8_block":
            seen.add(tuple(args[2].shape))
        return call(op, *args, **kw)

    model.ops.call = recording
    with torch.no_grad():
        model(torch.arange(1, 40, 3))
    assert seen and seen <= model.gemm_shapes(), f"ran {sorted(seen)}, listed {sorted(model.gemm_shapes())}"
    if kind == "deepseek-v3":  # MLA multiplies kv_b_proj dequantized: nothing to compile for it
        kv_b = model.layers[0].self_attn.kv_b_proj.weight.shape
        assert kv_b not in seen and kv_b not in model.gemm_shapes()
    assert model.prepare_kernels() == []


def test_gemm_shapes_list_a_fused_row_group_instead_of_its_parts():
    from torch import nn

    from quantkit.engine.model import CausalLM
    from quantkit.engine.qlinear import Fp8Block, Linear, RowGroup

    def proj(n: int) -> Linear:
        q, s = fp8_block.quantize_weight(torch.randn(n, 256) * 0.02)
        return Linear(Fp8Block(q, s, ActQuant("fp8-block")))

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.o = proj(256), proj(128), proj(384)
            self.qk = RowGroup((self.q, self.k))

    assert CausalLM.gemm_shapes(Holder()) == {(384, 256)}, "q + k fused (384 x 256), o (384 x 256); not q or k alone"
    h = Holder()
    h.o = proj(128)
    h.k = Linear(Fp8Block(*fp8_block.quantize_weight(torch.randn(100, 256)), ActQuant("fp8-block")))
    h.qk = RowGroup((h.k, h.q))  # 100 rows first: not whole scale tiles, no fusion: the parts run
    assert CausalLM.gemm_shapes(h) == {(100, 256), (256, 256), (128, 256)}
