"""MXFP4 (OCP MX v1.0): FP4 E2M1 elements, one E8M0 scale per 32 elements along the input dim.

GPT-OSS layout (transformers integrations/mxfp4.py, openai/gpt-oss torch/weights.py):
``*_blocks`` U8 [..., out, in/32, 16] and ``*_scales`` U8 [..., out, in/32].  In each byte the
LOW nibble is element 2j and the HIGH nibble element 2j+1.  value = LUT[code] * 2**(scale - 127).
E2M1 codes: bit 3 is the sign, bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6.

Encoding (``convert --to mxfp4``, synth): scale from :mod:`e8m0` with element "e2m1" (max 6),
then each element divided by it (a power of two: exact) is rounded onto the E2M1 grid, saturating
at +-6: ``nearest`` ties to even; ``stochastic`` picks one of the two neighbours of |v| with
ulp = 2**(max(floor(log2|v|), 0) - 1) (0.5 below 2, 1 in [2, 4), 2 in [4, 6]): t = |v| / ulp,
floor(t) + (u < f) ulps, f = frac(t) truncated to 20 bits, u the element's uniform from
:mod:`quantkit.formats.rounding` (as E4M3's stochastic rounding, :mod:`.fp8`).

compressed-tensors' MXFP4 (``mxfp4-pack-quantized``) stores the same bytes as ``weight_packed``
U8 [..., out, in/2] (its ``pack_fp4_to_uint8`` also puts element 2j in the low nibble) with
``weight_scale`` U8 [..., out, in/32].
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import e8m0
from .registry import Format, Grid, Spec, compressed_tensors
from .rounding import NEAREST, Rounding, uniform

BLOCK = 32
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# RNE decision points between consecutive magnitudes; ">" where the lower code is even, ">=" where odd
_UP_STRICT = (0.25, 1.25, 2.5, 5.0)  # ties go down (to codes 0, 2, 4, 6)
_UP_TIE = (0.75, 1.75, 3.5)  # ties go up (to codes 2, 4, 6)


def lut(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(FP4_VALUES, dtype=torch.float32, device=device)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] -> uint8 codes [..., 2n]; low nibble first."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., 2n] -> uint8 [..., n]; element 2j in the low nibble."""
    c = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return c[..., 0] | (c[..., 1] << 4)


def decode(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """GPT-OSS blocks [..., out, G, 16] + scales [..., out, G] -> [..., out, G*32] (out x in)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match [..., G, 16] / [..., G]")
    vals = lut(blocks.device)[unpack(blocks).long()]  # [..., out, G, 32]
    out = vals * e8m0.decode(scales).unsqueeze(-1)
    return out.flatten(-2).to(dtype)


def encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """float32 values already divided by their scale -> uint8 E2M1 codes (RNE, saturating)."""
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for t in _UP_STRICT:
        code += (a > t).to(torch.uint8)
    for t in _UP_TIE:
        code += (a >= t).to(torch.uint8)
    code = torch.where(torch.isnan(a), torch.full_like(code, 7), code)
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def round_e2m1_stochastic(v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """float32 v (already divided by its scale) -> float32 on the E2M1 grid, saturating at +-6,
    rounded up with the given uniforms u (float32 multiples of 2**-20 in [0, 1))."""
    a = v.abs().clamp(max=6.0)
    e = (torch.frexp(a)[1].to(torch.int32) - 1).clamp(min=0)  # floor(log2 a), at least 0
    ulp = ((e - 1 + 127) << 23).view(torch.float32)  # 2**(e-1), exact
    t = a / ulp  # exact: a power-of-two divisor
    fl = torch.floor(t)
    up = (u < torch.floor((t - fl) * 2.0**20) * 2.0**-20).to(torch.float32)
    return torch.copysign(((fl + up) * ulp).clamp(max=6.0), v)


def encode(w: torch.Tensor, rule: str = e8m0.DEFAULT_RULE, rounding: Rounding = NEAREST) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., out, in] -> (blocks U8 [..., out, in/32, 16], scales U8 [..., out, in/32]).

    Stochastic rounding draws element i's uniform at flat index ``rounding.offset + i`` of ``w``."""
    k = w.shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP4 needs the input dim to be a multiple of {BLOCK}, got {k}")
    g = w.to(torch.float32).unflatten(-1, (k // BLOCK, BLOCK))
    exp = e8m0.exponent(g.abs().amax(-1), "e2m1", rule)
    v = g / e8m0.pow2(exp.clamp(max=127)).unsqueeze(-1)
    if rounding.stochastic:
        v = round_e2m1_stochastic(v, uniform(rounding, tuple(v.shape), v.device))
    return pack(encode_e2m1(v)), e8m0.to_bytes(exp)


# GPT-OSS upstream's quantization_config (openai/gpt-oss-20b, -120b config.json)
GPT_OSS_CONFIG = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                  "quant_method": "mxfp4"}


class Mxfp4Format(Format):
    """``mxfp4`` as every part of quantkit asks for it (:class:`~quantkit.formats.registry.Format`): served as
    w4a16 (each call dequantizes the weight; activations stay unquantized, as GPT-OSS serves it).

    ``convert --to mxfp4`` writes GPT-OSS's fused experts as upstream ships them (``_blocks`` / ``_scales``,
    ``quant_method: mxfp4`` with ``modules_to_not_convert``: attention, routers, embeddings, lm_head, and experts
    --ignore kept); other families compressed-tensors ``mxfp4-pack-quantized`` (``weight_packed`` U8 [.., N, K/2] +
    ``weight_scale``; weights 4-bit float, group 32, no activation quantization: its MXFP4A16 scheme)."""

    name = "mxfp4"
    description = "E2M1 with one E8M0 scale per 1x32 along K (GPT-OSS blocks/scales)"
    scale_suffix = "_scales"
    convert_to = True
    buffers = ("blocks", "scales")
    row_blocks = (1, 1)
    weight_scale = Grid(1, BLOCK, e8m0=True, partial=False)
    references = {"mxfp4_decode": decode}

    def shape(self, tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], int, int]:
        blocks = tensors[0]
        return tuple(blocks.shape[:-3]), blocks.shape[-3], blocks.shape[-2] * BLOCK

    def check(self, tensors: Sequence[torch.Tensor]) -> None:
        blocks, scales = tensors
        if blocks.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
            raise ValueError(f"mxfp4 blocks {tuple(blocks.shape)} / scales {tuple(scales.shape)} are not U8 [.., N, K/32, 16] / [.., N, K/32]")

    def dequantize_weight(self, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return decode(blocks, scales, torch.float32)

    def dequant(self, ops: Any, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return ops.call("mxfp4_decode", blocks, scales, torch.float32)

    def stored(self, name: str, module: str, shape: tuple[int, ...], fused: bool) -> tuple[Spec, ...]:
        *lead, n, k = shape
        if k % BLOCK:
            raise ValueError(f"K={k} is not a multiple of {BLOCK}; MXFP4 has no layout for a partial 1x{BLOCK} block (keep it with --ignore)")
        if fused:  # GPT-OSS upstream: <p>_blocks [E, N, K/32, 16], <p>_scales [E, N, K/32]
            return (name + "_blocks", torch.uint8, (*lead, n, k // BLOCK, BLOCK // 2)), (name + "_scales", torch.uint8, (*lead, n, k // BLOCK))
        # compressed-tensors mxfp4-pack-quantized: weight_packed [N, K/2], weight_scale [N, K/32]
        return (module + ".weight_packed", torch.uint8, (*lead, n, k // 2)), (module + ".weight_scale", torch.uint8, (*lead, n, k // BLOCK))

    def quantize(self, call: Callable[..., Any], x: torch.Tensor, scale_fmt: str, rule: str, rounding: Rounding = NEAREST) -> tuple[torch.Tensor, ...]:
        """The reference on either device (no kernel registers an MXFP4 quantizer: a conversion-time op)."""
        return encode(x, rule, rounding)

    def dequantize(self, call: Callable[..., Any], *tensors: torch.Tensor) -> torch.Tensor:
        return call("mxfp4_decode", *tensors)

    def qconfig(self, scale_fmt: str | None, kept: list[str], unquantized: list[str], fused: bool) -> dict | None:
        if fused:
            qc = copy.deepcopy(GPT_OSS_CONFIG)
            qc["modules_to_not_convert"] += kept  # experts --ignore kept in BF16
            return qc
        return compressed_tensors("mxfp4-pack-quantized", 4, False, unquantized)
