"""The engine on a CUDA device, kernel path (``backend="auto"``: Triton / cuBLAS for act_quant, the
block-scaled GEMMs, fused MoE and attention) against the ops' torch references, one tiny model per
family and format, through a paged cache: prefill, decode, cache-less prefill.

Two checks, because dynamic FP8 quantization is discontinuous.  A last-bit difference in a GEMM
(the tensor core accumulates fp8 products in ~14 bits within a scale block) moves an activation
across an E4M3 rounding boundary at the next quantization: one element changes by an E4M3 ulp
(2**-3 relative), and such flips compound over layers (measured on the H200: 3-6% of the largest
logit on the MoE models, with the experts' routing identical or pinned to the reference's).  So:

* op by op: every op the model runs on a fast backend is re-run on its torch reference with the
  same inputs (:class:`Shadow`); quantizers and decoders must give the same bytes, float ops agree
  within their accumulation error (GEMM/attention: max |d| <= 1e-3 of max |ref|; fused MoE, which
  re-quantizes its intermediate: relative L2 <= 1e-2);
* end to end, only against gross errors (a wrong scale, layout or routing is O(1)):
  |logits_cuda - logits_cpu| <= 0.15 * max(1, max |logits_cpu|), float32 models.
Each case prints which backend ran each op (``model.ops.ran``) and asserts the fast ones did.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quantkit.engine import load
from quantkit.kernels.dispatch import Dispatcher, device_of

from .tiny import requantize
from .triton_forward import run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOL_END_TO_END = 0.15
EXACT_OPS = ("act_quant_fp8_block", "act_quant_mxfp8", "mxfp4_decode", "fp8_block_dequant", "mxfp8_dequant")
REL_L2_OPS = {"fused_moe": 1e-2}
MAX_REL = 1e-3  # every other float op
CASES = [
    ("deepseek-v3", "fp8-block"),
    ("qwen3-moe", "fp8-block"),
    ("qwen3-moe", "mxfp8"),
    ("gpt-oss", "mxfp8"),
    ("gpt-oss", "mxfp4"),
    ("qwen3", "fp8-block-ue8m0"),
]
GEMM = {"fp8-block": "gemm_fp8_block", "fp8-block-ue8m0": "gemm_fp8_block", "mxfp8": "gemm_mxfp8"}


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in (x if isinstance(x, tuple | list) else (x,)) if isinstance(t, torch.Tensor)]


def discrepancy(op: str, out, ref) -> float:
    """Bytes that differ (exact ops), relative L2 (fused MoE) or max |d| / max |ref| (the rest)."""
    worst = 0.0
    for o, r in zip(_tensors(out), _tensors(ref), strict=True):
        if op in EXACT_OPS:
            ob, rb = (t.reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8) for t in (o, r))  # unit strides (MN-major scales)
            worst = max(worst, float((ob != rb).sum()))
        elif op in REL_L2_OPS:
            worst = max(worst, ((o.float() - r.float()).norm() / r.float().norm().clamp(min=1e-30)).item())
        else:
            worst = max(worst, ((o.float() - r.float()).abs().max() / r.float().abs().max().clamp(min=1e-30)).item())
    return worst


def shadow(ops: Dispatcher) -> dict[str, float]:
    """Make ``ops`` re-run every fast op on its torch reference with the same inputs; returns the
    dict it fills with the worst discrepancy per op."""
    worst: dict[str, float] = {}
    call = ops.call

    def shadowed(op: str, *args, backend: str | None = None, **kw):
        out = call(op, *args, backend=backend, **kw)
        if ops.ran[op] != "torch":
            ref = ops.registry.resolve(op, device_of(args, kw), "torch").fn(*args, **kw)
            worst[op] = max(worst.get(op, 0.0), discrepancy(op, out, ref))
        return out

    ops.call = shadowed  # type: ignore[method-assign]  (this model's dispatcher only)
    return worst


@pytest.mark.parametrize(("kind", "fmt"), CASES)
def test_kernel_path_equals_cpu_reference(tiny, tmp_path: Path, kind: str, fmt: str) -> None:
    q, _ = requantize(tiny(kind), tmp_path / fmt, fmt, mxfp4_experts_only=fmt == "mxfp4")
    ref = run(load(q, "cpu", torch.float32, backend="torch"))
    model = load(q, "cuda", torch.float32)
    worst = shadow(model.ops)
    got = run(model)
    paths = sorted({layer.mlp.experts.path for layer in model.layers if hasattr(layer.mlp, "experts")})
    rel = [((g - r).abs().max() / r.abs().max().clamp(min=1.0)).item() for g, r in zip(got, ref, strict=True)]
    print(f"\n{kind} {fmt}: ops ran {model.ops.ran}; experts: {paths}; per-op discrepancy {worst}; end-to-end {rel}")
    for op, d in worst.items():
        bound = 0.0 if op in EXACT_OPS else REL_L2_OPS.get(op, MAX_REL)
        assert d <= bound, f"{op}: the fast backend differs from the torch reference on the same inputs: {d:g} > {bound:g}"
    assert max(rel) <= TOL_END_TO_END, f"end-to-end logits differ by {max(rel):.3f} of the largest logit"
    ran = model.ops.ran
    assert ran["attention_prefill"].startswith("triton.")
    assert ran.get("attention_decode", "triton.").startswith("triton.")
    if kind == "deepseek-v3":
        assert ran["mla_decode"].startswith("triton.")  # float32: FlashInfer's MLA runs bf16 only
    if fmt in GEMM:
        assert ran[GEMM[fmt]] != "torch" and ran[f"act_quant_{'mxfp8' if fmt == 'mxfp8' else 'fp8_block'}"] == "triton"
    if fmt == "mxfp4":
        assert ran["mxfp4_decode"] == "triton"
    if "fused_moe" in paths:
        assert ran["fused_moe"].startswith("triton.")
    assert set(worst) >= {op for op, b in ran.items() if b != "torch"}


def test_torch_backend_override_on_cuda(tiny, tmp_path: Path) -> None:
    """``backend="torch"`` keeps every op on its reference on CUDA too (what eval compares against)."""
    q, _ = requantize(tiny("gpt-oss"), tmp_path / "mxfp8", "mxfp8")
    model = load(q, "cuda", torch.float32, backend="torch")
    got, ref = run(model), run(load(q, "cpu", torch.float32, backend="torch"))
    assert set(model.ops.ran.values()) == {"torch"} and "fused_moe" in model.ops.ran
    for g, r in zip(got, ref, strict=True):
        assert (g - r).abs().max().item() <= 1e-4 * max(1.0, r.abs().max().item())


def test_prepare_kernels_builds_what_the_forward_runs(tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up compiles every DeepGEMM kernel auto will use: a forward at each of its M ranges then
    compiles nothing more."""
    from quantkit.kernels.gemm import deepgemm

    if not deepgemm.available(torch.device("cuda")).ok:
        pytest.skip("DeepGEMM is not available (headers, nvcc)")
    monkeypatch.setattr(deepgemm.SETTINGS, "cache_dir", tmp_path / "dg")
    monkeypatch.setattr(deepgemm, "_LIBS", {})
    q, _ = requantize(tiny("qwen3-moe"), tmp_path / "q", "fp8-block")
    model = load(q, "cuda", torch.bfloat16)
    assert model.prepare_kernels() == []
    built = set((tmp_path / "dg").glob("*.so"))
    assert built, "the tiny model's shapes should reach DeepGEMM"
    with torch.no_grad():
        for t in (30, 64, 100, 200, 400):
            model(torch.arange(1, t + 1, device="cuda") % 100)
    assert set((tmp_path / "dg").glob("*.so")) == built
    assert model.ops.ran["gemm_fp8_block"] in ("deepgemm", "triton.skinny", "triton.wgmma", "triton.tiled"), "ran names the leaf"
