"""Triton device functions that reproduce :mod:`quantkit.formats` bit for bit, and the Triton backend's availability.

Each step is exact or correctly rounded on every Triton target, GPU or CPU interpreter: amax is an integer max over
|x|'s bits (it keeps NaN); powers of two and E8M0 exponents go through float32 bits; x / s is :func:`divide`, never
``/`` (approximate on GPUs); an E4M3 byte comes from the hardware cast only where that is exact RNE (compiled sm_90+),
else it is assembled in integer arithmetic (:func:`e4m3_code`): the interpreter's cast rounds ties away and mishandles
carries and subnormals, and sm_89's rounds through fp16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, libdevice
from triton.runtime.interpreter import InterpretedFunction

from ..formats import rounding
from .dispatch import Availability, capability

PRIORITY = 10  # above the torch reference (0)
AMAX_FLOOR: tl.constexpr = tl.constexpr(1e-4)  # formats.fp8_block.AMAX_FLOOR


@triton.jit
def abs_max(x, axis: tl.constexpr):
    """max |x| along ``axis``, NaN if any: as int32, |x|'s bits order like the values with NaN above inf (a float max
    drops NaN)."""
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return tl.max(bits, axis).to(tl.float32, bitcast=True)


@triton.jit
def pow2(k):
    """int32 k in [-127, 128] -> float32 2**k (128 -> inf)."""
    bits = tl.where(k <= -127, 0x00400000, (k + 127) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def bf16_round(x, ROUND: tl.constexpr = True):
    """float32 -> the nearest bfloat16 (RNE) as float32, from the bits (the interpreter's cast truncates)."""
    if ROUND:
        bits = x.to(tl.int32, bitcast=True)
        r = (bits + (0x7FFF + ((bits >> 16) & 1))) & -0x10000
        return tl.where(x != x, x, r.to(tl.float32, bitcast=True))
    return x


@triton.jit
def e8m0_decode(b):
    """int32 E8M0 byte -> float32 2**(b-127); 0xFF -> NaN (formats.e8m0.decode)."""
    bits = tl.where(b == 0, 0x00400000, b << 23)
    return tl.where(b == 0xFF, float("nan"), bits.to(tl.float32, bitcast=True))


@triton.jit
def e8m0_decode_lean(b):
    """:func:`e8m0_decode` in three operations instead of five (a NaN's payload may differ): inf * 0 + inf is NaN."""
    f = tl.maximum(b.to(tl.int32) << 23, 0x00400000).to(tl.float32, bitcast=True)
    return tl.fma(f, 0.0, f)


@triton.jit
def times_group_scales(xf, s, KPS: tl.constexpr):
    """float32 [R, C] times one scale per KPS columns; ``s`` [R, C // KPS] or [1, C // KPS]."""
    R: tl.constexpr = xf.shape[0]
    C: tl.constexpr = xf.shape[1]
    G: tl.constexpr = C // KPS
    if G == 1:
        return xf * s
    return (tl.reshape(xf, (R, G, KPS)) * s[:, :, None]).reshape(R, C)


@triton.jit
def e8m0_exponent(amax, E_MAX: tl.constexpr, M_MAX: tl.constexpr, RCEIL: tl.constexpr):
    """float32 amax >= 0 -> int32 k of scale 2**k in [-127, 127]; NaN/Inf -> 128.

    k = floor(log2 amax) - E_MAX, +1 under rceil when the mantissa field exceeds M_MAX; a zero or subnormal amax
    gives k < -127, so the clamp matches formats.e8m0 without its frexp.
    """
    tl.static_assert(E_MAX >= 1)
    bits = amax.to(tl.int32, bitcast=True)
    e_field = (bits >> 23) & 0xFF
    k = e_field - 127 - E_MAX
    if RCEIL:
        k = k + ((bits & 0x7FFFFF) > M_MAX).to(tl.int32)
    k = tl.minimum(tl.maximum(k, -127), 127)
    return tl.where(e_field == 0xFF, 128, k)


@triton.jit
def fp8_block_scale(amax, UE8M0: tl.constexpr, RCEIL: tl.constexpr):
    """formats.fp8_block._scale: amax floored at 1e-4, then div_rn(amax, 448) or 2**exponent."""
    amax = tl.maximum(amax, AMAX_FLOOR, propagate_nan=tl.PropagateNan.ALL)
    if UE8M0:
        return pow2(e8m0_exponent(amax, 8, 0x600000, RCEIL))
    return tl.math.div_rn(amax, 448.0)


@triton.jit
def divide(x, s, inv, POW2: tl.constexpr):
    """x / s as IEEE division, given inv = div_rn(1, s) broadcast like s.

    A power of two has an exact inv, so x * inv is the quotient.  Otherwise Markstein's q' = fma(fma(-q, s, |x|), inv, q),
    q = |x| * inv, is correctly rounded (Markstein 1990; checked on 10**8 float32 pairs), except below 2**-126, where
    every E4M3 result is +-0 anyway.
    """
    if POW2:
        return x * inv
    a = tl.abs(x)
    q = a * inv
    q2 = tl.fma(tl.fma(-q, s, a), inv, q)
    q = tl.where(tl.abs(s) < float("inf"), q2, q)  # s = inf: |x| * 0 is the quotient; NaN stays NaN
    sign = x.to(tl.int32, bitcast=True) & -0x80000000
    return (q.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_code(v, r, STOCHASTIC: tl.constexpr, HW_CAST: tl.constexpr):
    """float32 v (divided by its scale) -> E4M3 byte as formats.fp8.round_e4m3; ``r``: :func:`random20`'s bits.

    Assembled: with |v| clamped to 448, e = max(floor(log2|v|), -6), t = |v| / 2**(e-3) is exact in [0, 16] and the byte is
    ((e + 6) << 3) + round(t), RNE through t + 2**23 (a carry to 16 is the next binade).
    """
    if STOCHASTIC:
        if HW_CAST:
            return e4m3_code_stochastic_hw(v, r)
        return e4m3_code_stochastic(v, r)
    if HW_CAST:
        c = tl.clamp(v, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        return c.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    is_nan = v != v
    a = tl.minimum((bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), 448.0)
    a = tl.where(is_nan, 0.0, a)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    t = a * ((130 - e) << 23).to(tl.float32, bitcast=True)  # a * 2**(3-e), exact
    n = (t + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    code = ((e + 6) << 3) + n
    return (tl.where(is_nan, 0x7F, code) | sign).to(tl.uint8)


@triton.jit
def e4m3_code_stochastic(v, r):
    """float32 v -> E4M3 byte rounded stochastically with 20 random bits r, in integer arithmetic only.

    The float32 bits of |v| >= 2**-6 hold t = |v| / ulp with frac(t) in the low 20 bits, and q holds an E4M3
    subnormal's t alike; adding 2**20 - 1 - r carries exactly when r < frac(t) * 2**20.
    """
    bits = v.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    is_nan = a > 0x7F800000
    a = tl.minimum(a, 0x43E00000)  # 448
    sh = tl.minimum(tl.maximum(121 - (a >> 23), 0), 31)
    q = tl.maximum(a, 0x3C000000 + (((a & 0x7FFFFF) | 0x800000) >> sh))
    code = ((q + (r ^ 0xFFFFF).to(tl.int32)) >> 20) - 960
    return (tl.where(is_nan, 0x7F, code) | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def e4m3_code_stochastic_hw(v, r):
    """:func:`e4m3_code_stochastic`'s bytes in half the integer instructions, where the hardware cast is exact.

    Below 2**-6, 8 + |v| * 2**9 rounded toward zero puts t's fraction bits where a normal |v| has them, so the same
    carry leaves an exact E4M3 value for the cast.
    """
    a = tl.minimum(tl.abs(v), 448.0, propagate_nan=tl.PropagateNan.ALL)
    sub = a < 0.015625
    x = tl.where(sub, libdevice.fma_rz(a, 512.0, 8.0), a).to(tl.int32, bitcast=True)
    x = tl.minimum(x, 0x7FC00000)  # a NaN's low field empty: the carry stays inside
    y = (((x + 0xFFFFF) - r.to(tl.int32)) & -0x100000).to(tl.float32, bitcast=True)
    y = tl.where(sub, tl.fma(y, 0.001953125, -0.015625), y)
    y = (y.to(tl.int32, bitcast=True) | (v.to(tl.int32, bitcast=True) & -0x80000000)).to(tl.float32, bitcast=True)
    return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel launched with ``launch_pdl`` starts while its predecessor runs: it waits here, before any load or store,
    for the predecessor's writes, then lets its dependent launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def mix32(x):
    """lowbias32 on uint32 (formats.rounding.mix32)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def random20(start, off, k0, k1, WRAP: tl.constexpr = True):
    """The 20 random bits of flat index start + off (formats.rounding.uniform = random20 * 2**-20); ``WRAP=False``
    promises no low word wraps (:func:`wraps`), which saves a select per element."""
    s_lo = (start & 0xFFFFFFFF).to(tl.uint32)
    s_hi = (start >> 32).to(tl.uint32)
    k1u = k1.to(tl.uint32, bitcast=True)
    k = k0.to(tl.uint32, bitcast=True) | 1
    c0 = mix32(s_hi ^ k1u)
    if WRAP:
        c1 = mix32((s_hi + 1) ^ k1u)
        lo = s_lo + off.to(tl.uint32)
        c = tl.where(lo < s_lo, c1, c0)
        return mix32(lo * k + c) >> 12
    return mix32(off.to(tl.uint32) * k + (s_lo * k + c0)) >> 12


def wraps(offset: int, n: int) -> bool:
    """Whether flat indices offset .. offset + n - 1 cross a multiple of 2**32."""
    return n > 0 and (offset >> 32) != ((offset + n - 1) >> 32)


def stream_key_i32(r: rounding.Rounding) -> tuple[int, int]:
    """The rounding's stream key as signed int32, so Triton types it i32 on every version."""
    return tuple(k - (1 << 32) if k >= 1 << 31 else k for k in rounding.stream_key(r.seed, r.name))  # type: ignore[return-value]


def interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return isinstance(pow2, InterpretedFunction)


def cdiv(a: int, b: int) -> int:
    """Host ceil-division: ``triton.cdiv`` costs about 1-2 us of call machinery, and a launcher asks several."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Host ``triton.next_power_of_2`` without its call machinery."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def compiled_sm90(device: torch.device) -> bool:
    """Compiled for NVIDIA sm_90+, where the E4M3 cast is exact and PDL exists."""
    return not interpreted() and device.type == "cuda" and torch.version.hip is None and capability(device) >= (9, 0)


def pdl_ok(device: torch.device, requested: bool = True) -> bool:
    """Whether a launch goes as a programmatic dependent: where requested and possible (same bytes)."""
    return requested and compiled_sm90(device)


def hw_e4m3(device: torch.device, requested: bool | None = None) -> bool:
    """Whether to round to E4M3 with the hardware cast: where it is exact, unless ``requested`` says; asking for it
    elsewhere raises."""
    exact = compiled_sm90(device)
    if requested and not exact:
        raise ValueError(f"the hardware E4M3 cast is not exact RNE on {device} here (needs compiled Triton on NVIDIA sm_90+)")
    return exact if requested is None else requested


def available(device: torch.device) -> Availability:
    """Compiled: CUDA only, eligible for auto.  Interpreted: any device, explicit only."""
    if interpreted():
        return Availability(True, auto=False, reason="Triton interpreter: only when asked for explicitly")
    if device.type == "cuda":
        return Availability(True)
    return Availability(False, reason=f"compiled Triton kernels need a CUDA device, got {device.type}")


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_input(x: torch.Tensor, what: str) -> None:
    """Every launcher's input rule: a contiguous float tensor."""
    assert x.is_contiguous(), f"{what}: the Triton kernel needs a contiguous tensor, got strides {x.stride()}"
    assert x.dtype in FLOAT_DTYPES, f"{what}: the Triton kernel reads {FLOAT_DTYPES}, got {x.dtype}"
