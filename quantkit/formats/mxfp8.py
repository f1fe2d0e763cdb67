"""MXFP8 (OCP MX v1.0): E4M3 elements, one E8M0 scale per 1x32 block along K (the input dim).

On disk (compressed-tensors ``mxfp8-quantized``): ``weight`` F8_E4M3 [..., N, K] and
``weight_scale`` U8 [..., N, K/32].  K must be a multiple of 32 (no rule covers a partial MX block).
Formula: k = exponent(amax, "e4m3", rule) (see :mod:`e8m0`), q = round_e4m3(x / 2**k); the
division by a power of two is exact, so only the element rounding rounds.  Activations use the
same function on [tokens, K].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import e8m0
from .fp8 import round_e4m3
from .registry import Format, Grid, Spec, compressed_tensors
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


class Mxfp8Format(Format):
    """``mxfp8`` as every part of quantkit asks for it (:class:`~quantkit.formats.registry.Format`).

    ``convert --to mxfp8`` writes compressed-tensors ``mxfp8-quantized`` (llm-compressor's MXFP8 scheme): ``weight``
    F8_E4M3 + ``weight_scale`` U8 [.., N, K/32]; input activations 1x32 E8M0 too, dynamic, served with rule rceil
    (as cuBLAS and TransformerEngine quantize them, whatever rule made the weights)."""

    name = "mxfp8"
    description = "E4M3 with one E8M0 scale per 1x32 along K (compressed-tensors mxfp8)"
    scale_suffix = "weight_scale"
    is_target = True
    convert_to = True
    buffers = ("q", "scale")
    row_blocks = (1, 1)
    weight_scale = Grid(1, BLOCK, e8m0=True, partial=False)
    act_scale = Grid(1, BLOCK, e8m0=True, partial=False)
    references = {"mxfp8_quantize": quantize, "mxfp8_dequant": dequantize, "act_quant_mxfp8": quantize}
    gemm_op = "gemm_mxfp8"

    def dequantize_weight(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return dequantize(q, scale.view(torch.uint8))

    def dequant(self, ops: Any, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return ops.call("mxfp8_dequant", q, scale)

    def quantize_act(self, x: torch.Tensor, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE,
                     *, scale_mn: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        return quantize(x, rule)

    def dequantize_act(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return dequantize(q, s.view(torch.uint8))

    def act_quant(self, ops: Any, x: torch.Tensor, scale_fmt: str, rule: str, **layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.call("act_quant_mxfp8", x, rule)

    def stored(self, name: str, module: str, shape: tuple[int, ...], fused: bool) -> tuple[Spec, ...]:
        *lead, n, k = shape
        if k % BLOCK:
            raise ValueError(f"K={k} is not a multiple of {BLOCK}; MXFP8 has no layout for a partial 1x{BLOCK} block (keep it with --ignore)")
        return (name, torch.float8_e4m3fn, shape), (name + "_scale", torch.uint8, (*lead, n, k // BLOCK))

    def quantize(self, call: Callable[..., Any], x: torch.Tensor, scale_fmt: str, rule: str, rounding: Rounding = NEAREST) -> tuple[torch.Tensor, ...]:
        return call("mxfp8_quantize", x, rule, rounding)

    def dequantize(self, call: Callable[..., Any], *tensors: torch.Tensor) -> torch.Tensor:
        return call("mxfp8_dequant", *tensors)

    def qconfig(self, scale_fmt: str | None, kept: list[str], unquantized: list[str], fused: bool) -> dict | None:
        return compressed_tensors("mxfp8-quantized", 8, True, unquantized)
