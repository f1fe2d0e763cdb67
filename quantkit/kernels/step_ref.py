"""Two ops of a decoder layer's small work, each one launch instead of many on a GPU: their arithmetic in
torch, registered as the ``"torch"`` reference (the Triton backends live in :mod:`.step_triton`).

| op            | input                                                        | returns                                   |
|---------------|--------------------------------------------------------------|-------------------------------------------|
| ``rope_rotate`` | x [T, H, D] (unit stride along D), cos, sin [T, D/2] in x's dtype, style | x rotated, [T, H, D] contiguous, x.dtype |
| ``add_rmsnorm`` | x, y [..., K] (one dtype), weight [K], eps, order          | (s = x + y in x.dtype, rms_norm(s))       |

``rope_rotate`` is :class:`quantkit.engine.layers.rope.Rope`'s rotation op for op: with x1, x2 the halves
(style "half") or the even and odd elements ("interleaved"), out = [x1 cos - x2 sin | x2 cos + x1 sin],
each product, difference and sum an operation in x's dtype (a bfloat16 op is the float32 op rounded to
bfloat16).  A kernel that rounds at the same points gives the same bytes.  The table (cos, sin) is made
once per step by the engine (:meth:`.Rope.cos_sin`); the op rotates q and k of every layer with it.

``add_rmsnorm`` is the residual add of a decoder layer followed by the next RMSNorm: s = x + y rounded to
the dtype, then RMSNorm(s) with the specified sum of squares of :func:`.fused_act_quant_ref.rms_norm`
(the order ``rmsnorm_act_quant`` specifies), so it may differ from the engine's unfused ``RMSNorm`` in
the last float32 bits of the mean, as that op does.  The engine fuses it for bfloat16 activations only.
"""

from __future__ import annotations

import torch

from . import dispatch
from .fused_act_quant_ref import ORDERS, rms_norm

STYLES = ("half", "interleaved")  # quantkit.engine.layers.rope.STYLES
DTYPES = (torch.bfloat16, torch.float32)


def check_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"rope style must be one of {STYLES}, not {style!r}")
    if x.dim() != 3 or x.shape[-1] % 2 or x.dtype not in DTYPES:
        raise ValueError(f"rope_rotate takes x [T, H, D] with D even in {DTYPES}, got {x.dtype}{tuple(x.shape)}")
    want = (x.shape[0], x.shape[2] // 2)
    if cos.shape != want or sin.shape != want or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError(f"rope_rotate: cos and sin must be {x.dtype}{want}, got {cos.dtype}{tuple(cos.shape)}, {sin.dtype}{tuple(sin.shape)}")


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "half") -> torch.Tensor:
    """x [T, H, D] rotated by the per-token table cos, sin [T, D/2] (module docstring)."""
    check_rope(x, cos, sin, style)
    d = x.shape[-1]
    c, s = cos[:, None], sin[:, None]
    x1, x2 = (x[..., : d // 2], x[..., d // 2 :]) if style == "half" else (x[..., 0::2], x[..., 1::2])
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


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


OPS = {"rope_rotate": rope_rotate, "add_rmsnorm": add_rmsnorm}
for _op, _fn in OPS.items():
    dispatch.register(_op, dispatch.REFERENCE, _fn)
