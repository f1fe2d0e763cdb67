"""FP8 E4M3 (``torch.float8_e4m3fn``) element rounding: bias 7, max +-448, no Inf, NaN = S.1111.111,
subnormals m * 2**-9.

Eager torch casts before 2.13 do not saturate, so every path clamps to +-448 before casting.
``nearest`` is the IEEE cast (ties to even).  ``stochastic`` rounds |v| between its two E4M3
neighbours: with ulp = 2**(max(floor(log2|v|), -6) - 3), t = |v| / ulp (exact), it picks
floor(t) + (u < f) ulps, f = frac(t) truncated to 20 bits (exact for normals; E4M3 subnormals
lose what lies below 2**-29), u a 20-bit uniform from :mod:`quantkit.formats.rounding`.
"""

from __future__ import annotations

import torch

from .rounding import NEAREST, Rounding, uniform

E4M3_MAX = 448.0
E4M3_MIN_NORMAL_EXP = -6
E4M3_MANT_BITS = 3


def round_e4m3(v: torch.Tensor, rounding: Rounding = NEAREST) -> torch.Tensor:
    """float32 values (already divided by their scale) -> float8_e4m3fn, saturating."""
    v = v.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX)
    if not rounding.stochastic:
        return v.to(torch.float8_e4m3fn)
    return round_e4m3_given(v, uniform(rounding, tuple(v.shape), v.device))


def round_e4m3_given(v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding of float32 v to E4M3 with the given uniforms u (float32 multiples of 2**-20 in [0, 1))."""
    v = v.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX)
    a = v.abs()
    e = torch.frexp(a)[1].to(torch.int32) - 1  # floor(log2 a) for a > 0
    e = e.clamp(min=E4M3_MIN_NORMAL_EXP)
    inv_ulp = (((E4M3_MANT_BITS - e) + 127) << 23).view(torch.float32)  # 2**(3-e), exact
    t = a * inv_ulp
    fl = torch.floor(t)
    up = (u < torch.floor((t - fl) * 2.0**20) * 2.0**-20).to(torch.float32)  # all exact in float32
    q = (fl + up) / inv_ulp  # exact: a power-of-two division of a small integer
    return torch.copysign(q, v).to(torch.float8_e4m3fn)
