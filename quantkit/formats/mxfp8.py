"""MXFP8 (OCP MX v1.0): E4M3 elements, one E8M0 scale per 1x32 block along K (the input dim).

On disk (compressed-tensors ``mxfp8-quantized``): ``weight`` F8_E4M3 [..., N, K] and
``weight_scale`` U8 [..., N, K/32].  K must be a multiple of 32 (no rule covers a partial MX block).
Formula: k = exponent(amax, "e4m3", rule) (see :mod:`e8m0`), q = round_e4m3(x / 2**k); the
division by a power of two is exact, so only the element rounding rounds.  Activations use the
same function on [tokens, K].
"""

from __future__ import annotations

import torch

from . import e8m0
from .fp8 import round_e4m3
from .rounding import NEAREST, Rounding

BLOCK = 32


def quantize(
    x: torch.Tensor, rule: str = e8m0.DEFAULT_RULE, rounding: Rounding = NEAREST
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (F8_E4M3 [..., K], U8 E8M0 [..., K/32])."""
    k = x.shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP8 needs K to be a multiple of {BLOCK}, got {k}")
    g = x.to(torch.float32).unflatten(-1, (k // BLOCK, BLOCK))
    exp = e8m0.exponent(g.abs().amax(-1), "e4m3", rule)
    v = g / e8m0.pow2(exp.clamp(max=127)).unsqueeze(-1)
    return round_e4m3(v.flatten(-2), rounding), e8m0.to_bytes(exp)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(F8_E4M3 [..., K], U8 [..., K/32]) -> float32 [..., K]."""
    k = q.shape[-1]
    if scale.shape[-1] * BLOCK != k or scale.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"MXFP8 scale {tuple(scale.shape)} does not fit elements {tuple(q.shape)} (1x{BLOCK} blocks)")
    return (q.to(torch.float32).unflatten(-1, (-1, BLOCK)) * e8m0.decode(scale).unsqueeze(-1)).flatten(-2)
