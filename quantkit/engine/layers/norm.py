"""RMSNorm as the families' references compute it.

y = x * rsqrt(mean(x**2) + eps) in float32, then times the weight.  Two orders exist upstream:
``"hf"`` (transformers Llama/Qwen3/DeepseekV3: cast the normalised value back to the input dtype,
then multiply by the weight in that dtype) and ``"f32"`` (transformers GptOss and the gpt-oss
reference: multiply in float32, then cast).  They agree exactly in float32.

:func:`add_norm`: a decoder layer's residual add and the RMSNorm after it, as one op (``add_rmsnorm``,
quantkit/kernels/norm/add_rmsnorm_ref.py) for bf16 activations: one launch instead of about ten on a GPU, its sum of
squares in the same specified order as the fused quantizing norm below (so the same caveat holds).

:func:`norm_quantized`: when every projection that reads the normed x quantizes its input the
same way (fp8-block / mxfp8 weights, dynamic activation quantization) and activations are bf16,
the norm and that quantization run as one op, ``rmsnorm_act_quant``
(quantkit/kernels/quant/fused_act_quant_ref.py): x is read once and only E4M3 bytes + scales are
written, once for all the projections instead of once each.  Its sum of squares has a specified
order (torch's differs by device and size), so in bf16 it may differ from :class:`RMSNorm` by one
bf16 ulp on a few elements (at most 2e-5 of them, measured at K = 256-7168); float32 activations
keep the unfused path, where the engine must match transformers exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

ORDERS = ("hf", "f32")
FUSED_DTYPES = (torch.bfloat16,)  # activation dtypes where the fused op replaces norm + quantization


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float, order: str = "hf") -> None:
        super().__init__()
        if order not in ORDERS:
            raise ValueError(f"RMSNorm order must be one of {ORDERS}, not {order!r}")
        self.register_buffer("weight", weight)
        self.eps = float(eps)
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.order == "f32":
            return (self.weight.to(torch.float32) * h).to(dtype)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, order={self.order}"


def fusable(norm: RMSNorm, x: torch.Tensor) -> bool:
    """Whether a fused op may replace ``norm`` on x: bf16 activations, and a norm that keeps their dtype (an
    "hf"-order weight of a wider dtype would promote its output)."""
    out_dtype = x.dtype if norm.order == "f32" else torch.promote_types(norm.weight.dtype, x.dtype)
    return x.dtype in FUSED_DTYPES and out_dtype == x.dtype


def norm_quantized(norm: RMSNorm, consumers: Sequence[nn.Module], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(E4M3 bytes, scales) of norm(x) quantized as all ``consumers`` (Linear modules) quantize
    their input, from one fused op; None when they do not all quantize alike (or x is not bf16,
    or an "hf"-order norm's weight would promote the output): then run the norm and the projections."""
    if not fusable(norm, x) or not consumers:
        return None
    acts = {getattr(c.weight, "act", None) for c in consumers}
    if len(acts) != 1 or None in acts:
        return None
    act = acts.pop()
    ops = consumers[0].weight.ops
    return ops.call("rmsnorm_act_quant", x, norm.weight, norm.eps, act.kind, act.scale_fmt, act.rule, norm.order, **act.layout())


def add_norm(norm: RMSNorm, x: torch.Tensor, y: torch.Tensor, ops=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(s = x + y, norm(s)); one ``add_rmsnorm`` op through ``ops`` (the model's dispatcher) where x is bf16
    and the norm keeps its dtype, else the add and the norm."""
    if ops is None or not fusable(norm, x) or y.dtype != x.dtype or y.shape != x.shape:
        s = x + y
        return s, norm(s)
    return ops.call("add_rmsnorm", x, y, norm.weight, norm.eps, norm.order)
