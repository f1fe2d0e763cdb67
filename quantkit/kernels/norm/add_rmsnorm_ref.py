"""The residual add + RMSNorm op of a decoder layer, in torch (the ``"torch"`` reference; Triton: :mod:`.add_rmsnorm`).

``add_rmsnorm(x, y, weight, eps, order)`` -> (s = x + y in x.dtype, RMSNorm(s)): s rounded to the dtype, then RMSNorm
with the specified sum of squares of :func:`..quant.fused_act_quant_ref.rms_norm` (``rmsnorm_act_quant``'s order), so it
may differ from the engine's unfused ``RMSNorm`` in the last float32 bits of the mean.  The engine fuses it for
bfloat16 activations only.
"""

from __future__ import annotations

import torch

from .. import dispatch
from ..quant.fused_act_quant_ref import ORDERS, rms_norm

DTYPES = (torch.bfloat16, torch.float32)


def check_add_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"RMSNorm order must be one of {ORDERS}, not {order!r}")
    if x.shape != y.shape or x.dtype != y.dtype or x.dtype not in DTYPES:
        raise ValueError(f"add_rmsnorm adds two tensors of one shape and dtype in {DTYPES}, got {x.dtype}{tuple(x.shape)} and {y.dtype}{tuple(y.shape)}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"add_rmsnorm: weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    if order == "hf" and torch.promote_types(weight.dtype, x.dtype) != x.dtype:
        raise ValueError(f"add_rmsnorm: an 'hf'-order weight {weight.dtype} would promote {x.dtype} activations")


def add_rmsnorm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> tuple[torch.Tensor, torch.Tensor]:
    """(s = x + y, RMSNorm(s)), both in x.dtype (module docstring)."""
    check_add_norm(x, y, weight, order)
    s = x + y
    return s, rms_norm(s, weight, eps, order)


dispatch.register("add_rmsnorm", dispatch.REFERENCE, add_rmsnorm)
