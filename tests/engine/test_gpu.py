"""The engine on a CUDA device, kernel path (``backend="auto"``: Triton / cuBLAS for act_quant, the
block-scaled GEMMs, fused MoE and attention) against the CPU reference (the ops' torch backends),
one tiny model per family and format, through a paged cache: prefill, decode, cache-less prefill.

Tolerance: |logits_cuda - logits_cpu| <= 2e-2 * max(1, max |logits_cpu|), float32 models.  The
kernels compute the references' function up to float32 summation order (fp8 products are exact;
the tensor core accumulates ~14 bits within a scale block), and a last-bit difference can move an
activation across an E4M3 rounding boundary at the next dynamic quantization (one E4M3 ulp, 2**-3
relative, of one element), which is what the bound leaves room for.  Each case prints which
backend ran each op (``model.ops.ran``) and asserts the fast ones did.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quantkit.engine import load

from .tiny import requantize
from .triton_forward import run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOL = 2e-2
CASES = [
    ("deepseek-v3", "fp8-block"),
    ("qwen3-moe", "fp8-block"),
    ("qwen3-moe", "mxfp8"),
    ("gpt-oss", "mxfp8"),
    ("gpt-oss", "mxfp4"),
    ("qwen3", "fp8-block-ue8m0"),
]
GEMM = {"fp8-block": "gemm_fp8_block", "fp8-block-ue8m0": "gemm_fp8_block", "mxfp8": "gemm_mxfp8"}


@pytest.mark.parametrize(("kind", "fmt"), CASES)
def test_kernel_path_equals_cpu_reference(tiny, tmp_path: Path, kind: str, fmt: str) -> None:
    q, _ = requantize(tiny(kind), tmp_path / fmt, fmt, mxfp4_experts_only=fmt == "mxfp4")
    ref = run(load(q, "cpu", torch.float32, backend="torch"))
    model = load(q, "cuda", torch.float32)
    got = run(model)
    paths = sorted({layer.mlp.experts.path for layer in model.layers if hasattr(layer.mlp, "experts")})
    print(f"\n{kind} {fmt}: ops ran {model.ops.ran}; experts: {paths}")
    for g, r in zip(got, ref, strict=True):
        assert (g - r).abs().max().item() <= TOL * max(1.0, r.abs().max().item())
    ran = model.ops.ran
    assert ran["attention_prefill"] == "triton"
    assert ran.get("attention_decode", "triton") == "triton"  # MLA (DeepSeek) decodes through prefill
    if fmt in GEMM:
        assert ran[GEMM[fmt]] != "torch" and ran[f"act_quant_{'mxfp8' if fmt == 'mxfp8' else 'fp8_block'}"] == "triton"
    if fmt == "mxfp4":
        assert ran["mxfp4_decode"] == "triton"
    if "fused_moe" in paths:
        assert ran["fused_moe"] == "triton"


def test_torch_backend_override_on_cuda(tiny, tmp_path: Path) -> None:
    """``backend="torch"`` keeps every op on its reference on CUDA too (what eval compares against)."""
    q, _ = requantize(tiny("gpt-oss"), tmp_path / "mxfp8", "mxfp8")
    model = load(q, "cuda", torch.float32, backend="torch")
    got, ref = run(model), run(load(q, "cpu", torch.float32, backend="torch"))
    assert set(model.ops.ran.values()) == {"torch"} and "fused_moe" in model.ops.ran
    for g, r in zip(got, ref, strict=True):
        assert (g - r).abs().max().item() <= 1e-4 * max(1.0, r.abs().max().item())
