"""A numeric format defined in this one file, for tests/test_extension_points.py: ``fp8-g64``, E4M3 elements with
one float32 scale per 1x64 block along K, for weights and (per token) activations alike.

    s = max(amax over the block, 1e-4) / 448     (float32 IEEE division)
    q = round_e4m3(x / s);  x_dq = q * s

Loading this module registers the format (subclassing :class:`quantkit.formats.Format`); nothing else in quantkit
names it.  Its ops' references are this module's functions, registered under the op names in ``references``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from quantkit.formats import Format, Grid
from quantkit.formats.fp8 import E4M3_MAX, round_e4m3
from quantkit.formats.rounding import NEAREST, Rounding

G = 64  # K columns per scale


def quantize(x: torch.Tensor, rule: str = "rceil", rounding: Rounding = NEAREST) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (E4M3 [..., K], F32 [..., K/64]); ``rule`` is unused (no E8M0 scales)."""
    if x.shape[-1] % G:
        raise ValueError(f"fp8-g64 needs K to be a multiple of {G}, got {x.shape[-1]}")
    g = x.to(torch.float32).unflatten(-1, (-1, G))
    amax = g.abs().amax(-1).clamp(min=1e-4)
    s = amax / torch.full_like(amax, E4M3_MAX)
    return round_e4m3((g / s[..., None]).flatten(-2), rounding), s


def dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(E4M3 [..., K], F32 [..., K/64]) -> float32 [..., K]."""
    return (q.to(torch.float32).unflatten(-1, (-1, G)) * s[..., None]).flatten(-2)


class Fp8G64(Format):
    name = "fp8-g64"
    description = "E4M3 with one F32 scale per 1x64 along K (a test's format)"
    scale_suffix = "weight_scale"
    convert_to = True
    buffers = ("q", "scale")
    row_blocks = (1, 1)
    weight_scale = Grid(1, G, e8m0=False, partial=False)
    act_scale = Grid(1, G, e8m0=False, partial=False)
    references = {"fp8_g64_quantize": quantize, "fp8_g64_dequant": dequantize, "act_quant_fp8_g64": quantize}
    gemm_op = "gemm_fp8_g64"

    def dequantize_weight(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return dequantize(q, s)

    def dequant(self, ops: Any, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return ops.call("fp8_g64_dequant", q, s)

    def quantize_act(self, x: torch.Tensor, scale_fmt: str = "float", rule: str = "rceil", *, scale_mn: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize(x)

    def dequantize_act(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return dequantize(q, s)

    def act_quant(self, ops: Any, x: torch.Tensor, scale_fmt: str, rule: str, **layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.call("act_quant_fp8_g64", x)

    def stored(self, name: str, module: str, shape: tuple[int, ...], fused: bool) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
        *lead, n, k = shape
        if k % G:
            raise ValueError(f"K={k} is not a multiple of {G}")
        return (name, torch.float8_e4m3fn, shape), (name + "_scale", torch.float32, (*lead, n, k // G))

    def quantize(self, call: Callable[..., Any], x: torch.Tensor, scale_fmt: str, rule: str, rounding: Rounding = NEAREST) -> tuple[torch.Tensor, ...]:
        return call("fp8_g64_quantize", x, rule, rounding)

    def dequantize(self, call: Callable[..., Any], *tensors: torch.Tensor) -> torch.Tensor:
        return call("fp8_g64_dequant", *tensors)

    def qconfig(self, scale_fmt: str | None, kept: list[str], unquantized: list[str], fused: bool) -> dict | None:
        return {"quant_method": "fp8-g64", "group_size": G, "ignore": unquantized}
