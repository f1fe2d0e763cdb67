"""MXFP4 (OCP MX v1.0): FP4 E2M1 elements, one E8M0 scale per 32 elements along the input dim.

GPT-OSS layout (transformers integrations/mxfp4.py, openai/gpt-oss torch/weights.py):
``*_blocks`` U8 [..., out, in/32, 16] and ``*_scales`` U8 [..., out, in/32].  In each byte the
LOW nibble is element 2j and the HIGH nibble element 2j+1.  value = LUT[code] * 2**(scale - 127).
E2M1 codes: bit 3 is the sign, bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6.

Encoding (for synth and round trips): scale from :mod:`e8m0` with element "e2m1" (max 6), then
round-to-nearest-even onto the E2M1 grid, saturating at +-6.
"""

from __future__ import annotations

import torch

from . import e8m0

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


def encode(w: torch.Tensor, rule: str = e8m0.DEFAULT_RULE) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., out, in] -> (blocks U8 [..., out, in/32, 16], scales U8 [..., out, in/32])."""
    k = w.shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP4 needs the input dim to be a multiple of {BLOCK}, got {k}")
    g = w.to(torch.float32).unflatten(-1, (k // BLOCK, BLOCK))
    exp = e8m0.exponent(g.abs().amax(-1), "e2m1", rule)
    v = g / e8m0.pow2(exp.clamp(max=127)).unsqueeze(-1)
    return pack(encode_e2m1(v)), e8m0.to_bytes(exp)
