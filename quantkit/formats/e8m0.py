"""E8M0 power-of-two scales (OCP MX v1.0): byte b means 2**(b - 127); 0xFF is NaN; 0x00 is 2**-127.

On disk E8M0 is stored as U8 (or F8_E8M0, the same bytes).  Never produce it with
``.to(torch.float8_e8m0fnu)``: that cast rounds to nearest (1.5 -> 2, 3 -> 4), which is neither
scale rule.  Here the exponent is computed exactly from the amax's float32 bits.

Scale rules, for a block with absolute maximum ``amax`` and an element format whose largest
normal is ``m_max * 2**e_max`` (E4M3: 1.75 * 2**8 = 448; E2M1: 1.5 * 2**2 = 6):

* ``floor`` (OCP spec): X = 2**(floor(log2 amax) - e_max).  Elements above the element max
  after scaling saturate to it.
* ``rceil`` (cuBLAS, TransformerEngine, ModelOpt): X = 2**ceil(log2(amax / max)), the smallest
  power of two that never clips.  Computed exactly: with amax = m * 2**e (1 <= m < 2),
  k = e - e_max + (m > m_max).

The two differ only when amax's mantissa exceeds the element max's.  quantkit's default is
``rceil``: it never clips, it is what the Hopper/Blackwell GEMM libraries and TransformerEngine
produce, and it makes the MXFP4 -> MXFP8 exact path agree with requantization more often.
Exponents are clamped to [-127, 127]; amax == 0 gives byte 0 (2**-127, the zero block stays
zero); a NaN or Inf amax gives the NaN byte 0xFF.
"""

from __future__ import annotations

import torch

RULES = ("floor", "rceil")
DEFAULT_RULE = "rceil"
NAN_BYTE = 0xFF
BIAS = 127

# element format -> (e_max, mantissa bits of the largest normal as a 23-bit f32 mantissa field)
ELEMENTS: dict[str, tuple[int, int]] = {
    "e4m3": (8, 0x600000),  # 448 = 1.75 * 2**8
    "e2m1": (2, 0x400000),  # 6 = 1.5 * 2**2
}


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"scale rule must be one of {RULES}, not {rule!r}")
    return rule


def exponent(amax: torch.Tensor, element: str, rule: str) -> torch.Tensor:
    """int32 scale exponent k (scale = 2**k) per block; NaN/Inf amax -> 128 (the NaN byte)."""
    check_rule(rule)
    e_max, m_max = ELEMENTS[element]
    a = amax.to(torch.float32)
    bits = a.view(torch.int32)
    e_field = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    # subnormal f32 amax: normalise through frexp (exact); normal: read the fields
    m, e = torch.frexp(a)
    sub = e_field == 0
    e_unb = torch.where(sub, e.to(torch.int32) - 1, e_field - 127)
    mant = torch.where(sub, ((m.abs() * 2 - 1) * 2**23).to(torch.int32), mant)
    k = e_unb - e_max
    if rule == "rceil":
        k = k + (mant > m_max).to(torch.int32)
    k = torch.where(a == 0, torch.full_like(k, -BIAS), k)
    k = k.clamp(-BIAS, BIAS)
    return torch.where(torch.isfinite(a), k, torch.full_like(k, BIAS + 1))


def to_bytes(k: torch.Tensor) -> torch.Tensor:
    """Exponent -> E8M0 byte (uint8); 128 (from a NaN amax) -> 0xFF."""
    return (k + BIAS).clamp(0, 255).to(torch.uint8)


def encode(amax: torch.Tensor, element: str, rule: str = DEFAULT_RULE) -> torch.Tensor:
    return to_bytes(exponent(amax, element, rule))


def decode(b: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (uint8 or float8_e8m0fnu) -> float32 2**(b-127); 0xFF -> NaN."""
    if b.dtype != torch.uint8:
        b = b.view(torch.uint8)
    e = b.to(torch.int32)
    # 2**(e-127) built from float32 bits; e == 0 is the subnormal 2**-127 = bits 0x00400000
    bits = torch.where(e == 0, torch.full_like(e, 0x00400000), e << 23)
    out = bits.view(torch.float32)
    return torch.where(e == NAN_BYTE, torch.full_like(out, float("nan")), out)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """float32 2**k for integer k in [-127, 127] (exact, from the bits; 2**-127 is subnormal)."""
    k = k.to(torch.int32)
    bits = torch.where(k <= -BIAS, torch.full_like(k, 0x00400000), (k + BIAS) << 23)
    return bits.view(torch.float32)
