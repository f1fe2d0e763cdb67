"""The residual add + RMSNorm of a decoder layer in torch (Triton: :mod:`.add_rmsnorm`): (s = x + y, RMSNorm(s)) in
x.dtype, summing squares in :func:`..quant.fused_act_quant_ref.rms_norm`'s order (the engine's unfused mean may differ
in its last bits).
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
    """(s = x + y, RMSNorm(s)), both in x.dtype."""
    check_add_norm(x, y, weight, order)
    s = x + y
    return s, rms_norm(s, weight, eps, order)


dispatch.register("add_rmsnorm", dispatch.REFERENCE, add_rmsnorm)
