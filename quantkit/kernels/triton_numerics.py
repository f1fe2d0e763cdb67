"""Triton device functions that reproduce :mod:`quantkit.formats` bit for bit, and the Triton
backend's availability predicate.

Each result comes from integer bit patterns and float32 operations that are exact or correctly
rounded on every Triton target (NVIDIA GPUs and the CPU interpreter):

* amax: an integer max over the bits of |x|, which keeps NaN as ``torch.amax`` does;
* powers of two are built from their bits (:func:`formats.e8m0.pow2`); the E8M0 exponent is
  read from the amax's float32 bits (:func:`formats.e8m0.exponent`);
* x / s is the IEEE quotient, never plain ``/`` (approximate on GPUs): with inv = div_rn(1, s)
  computed once per tile or group, a power-of-two s gives x * inv (exact), any other s gives
  Markstein's correction q = |x| inv, r = fma(-q, s, |x|), q' = fma(r, inv, q), which is the
  correctly rounded |x| / s when inv is the correctly rounded reciprocal (Markstein 1990;
  checked here against IEEE division on 10**8 float32 pairs, ties and near-ties included).
  Only below 2**-126 may q' differ, where every E4M3 result is +-0 anyway;
* E4M3 bytes: on sm_90+ compiled, ``.to(tl.float8e4nv)`` (RTNE is Triton's default for
  downcasts; it lowers to ``cvt.rn.satfinite.e4m3x2.f32``) after clamping to +-448.  Elsewhere
  the byte is assembled from |v| / ulp (exact) rounded to an integer: the interpreter's software
  cast rounds ties away from zero, drops the carry of a mantissa overflow into an odd exponent
  field (1.9375 -> 1.0 instead of 2.0) and truncates results below 2**-6, and on sm_89 Triton
  goes through an fp16 round-toward-zero step that breaks ties.  Stochastic rounding decides
  the carry on the float32 bits, then casts the exact result on sm_90+ compiled and assembles
  the byte elsewhere;
* the stochastic-rounding uniform is the lowbias32 counter hash of :mod:`formats.rounding` in
  uint32 arithmetic (wrap-around multiply, logical shifts); its key (k0, k1) comes from
  :func:`formats.rounding.stream_key` on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, libdevice
from triton.runtime.interpreter import InterpretedFunction

from ..formats import rounding
from .dispatch import Availability, capability

PRIORITY = 10  # above the torch reference (0); a cuBLAS/FlashInfer backend may rank higher
AMAX_FLOOR: tl.constexpr = tl.constexpr(1e-4)  # formats.fp8_block.AMAX_FLOOR


@triton.jit
def abs_max(x, axis: tl.constexpr):
    """max |x| along ``axis`` of float32 x; NaN anywhere gives NaN, as torch.amax.

    The bits of |x| order like the values as int32, and every NaN lies above inf, so an integer
    max keeps NaN without a second reduction (Triton's float max drops NaN).
    """
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return tl.max(bits, axis).to(tl.float32, bitcast=True)


@triton.jit
def pow2(k):
    """int32 k in [-127, 128] -> float32 2**k (2**-127 is the subnormal 0x00400000; 128 -> inf)."""
    bits = tl.where(k <= -127, 0x00400000, (k + 127) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def bf16_round(x, ROUND: tl.constexpr = True):
    """float32 -> the nearest bfloat16 (ties to even), still float32, from the bits (the CPU
    interpreter's own cast truncates); NaN stays NaN; identity unless ROUND."""
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
    """U8 E8M0 bytes -> float32 2**(b - 127) in three operations, against five for :func:`e8m0_decode` (same
    values; a NaN's payload may differ): the byte as the exponent field (0 -> 0.0, 255 -> inf), raised to
    2**-127 for byte 0, and inf turned to NaN (inf * 0 + inf)."""
    f = tl.maximum(b.to(tl.int32) << 23, 0x00400000).to(tl.float32, bitcast=True)  # byte 0: 2**-127, a float32 subnormal
    return tl.fma(f, 0.0, f)


@triton.jit
def times_group_scales(xf, s, KPS: tl.constexpr):
    """float32 [R, C] times one scale per KPS columns: ``s`` [R, C // KPS] (each row its own) or
    [1, C // KPS] (one row of scales for the tile)."""
    R: tl.constexpr = xf.shape[0]
    C: tl.constexpr = xf.shape[1]
    G: tl.constexpr = C // KPS
    if G == 1:
        return xf * s
    return (tl.reshape(xf, (R, G, KPS)) * s[:, :, None]).reshape(R, C)


@triton.jit
def e8m0_exponent(amax, E_MAX: tl.constexpr, M_MAX: tl.constexpr, RCEIL: tl.constexpr):
    """float32 amax >= 0 -> int32 k of scale 2**k, clamped to [-127, 127]; NaN/Inf -> 128.

    k = floor(log2 amax) - E_MAX (+1 under rceil when the mantissa field exceeds M_MAX).  A
    subnormal or zero amax (exponent field 0) gives k < -127 for every E_MAX >= 1, i.e. the clamp
    to -127 that formats.e8m0 applies after normalising it through frexp (and to amax == 0).
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
    """formats.fp8_block._scale: amax floored at 1e-4, then amax / 448 or 2**exponent."""
    amax = tl.maximum(amax, AMAX_FLOOR, propagate_nan=tl.PropagateNan.ALL)
    if UE8M0:
        return pow2(e8m0_exponent(amax, 8, 0x600000, RCEIL))
    return tl.math.div_rn(amax, 448.0)


@triton.jit
def divide(x, s, inv, POW2: tl.constexpr):
    """x / s as IEEE division, given inv = div_rn(1, s) broadcast like s (see module docstring)."""
    if POW2:
        return x * inv  # s = 2**k (or inf / NaN): inv is exact, so is the product
    a = tl.abs(x)
    q = a * inv
    q2 = tl.fma(tl.fma(-q, s, a), inv, q)
    q = tl.where(tl.abs(s) < float("inf"), q2, q)  # s = inf: |x| * 0 is the quotient; NaN stays NaN
    sign = x.to(tl.int32, bitcast=True) & -0x80000000
    return (q.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_code(v, r, STOCHASTIC: tl.constexpr, HW_CAST: tl.constexpr):
    """float32 v (already divided by its scale) -> E4M3 byte, as formats.fp8.round_e4m3.

    ``r``: the element's 20 random bits (:func:`random20`) when STOCHASTIC, else unused.
    Nearest, assembled: |v| is clamped to 448; with e = max(floor(log2|v|), -6) and
    ulp = 2**(e-3), t = |v|/ulp is exact and lies in [0, 16]; the byte is ((e + 6) << 3) +
    round(t) (a carry to 16 moves to the next binade by itself; e = -6 covers the subnormals),
    round being ties-to-even through the float32 addition t + 2**23.  Stochastic: see
    :func:`e4m3_code_stochastic` (assembled) and :func:`e4m3_code_stochastic_hw` (HW_CAST).
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
    """float32 v -> E4M3 byte rounded stochastically with 20 random bits r (uint32 < 2**20),
    in integer arithmetic only (no conversions): formats.fp8.round_e4m3 bit for bit.

    With |v| clamped to 448 and E = floor(log2|v|): for E >= -6 the float32 bits hold t = |v|/ulp
    as bits >> 20 = (E + 127) * 8 + floor(t) - 8 and frac(t) * 2**20 in the low 20 bits; below,
    q = 0x3c000000 + (significand >> (121 - exponent field)) holds the E4M3 subnormal t the same
    way (exponent field 120, t * 2**20 truncated in the low 23 bits; max(bits, q) picks the right
    one).  Adding 2**20 - 1 - r carries exactly when r < frac(t) * 2**20 (truncated), so the byte is
    ((q + (2**20 - 1 - r)) >> 20) - 960 (a carry out of the mantissa moves to the next binade).
    """
    bits = v.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    is_nan = a > 0x7F800000
    a = tl.minimum(a, 0x43E00000)  # |v| <= 448 (0x43e00000), inf included
    sh = tl.minimum(tl.maximum(121 - (a >> 23), 0), 31)
    q = tl.maximum(a, 0x3C000000 + (((a & 0x7FFFFF) | 0x800000) >> sh))
    code = ((q + (r ^ 0xFFFFF).to(tl.int32)) >> 20) - 960
    return (tl.where(is_nan, 0x7F, code) | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def e4m3_code_stochastic_hw(v, r):
    """:func:`e4m3_code_stochastic` with the float pipe and the hardware cast doing most of the
    work (compiled NVIDIA sm_90+ only, where ``.to(tl.float8e4nv)`` is exact RNE with satfinite):
    same bytes, about half the integer instructions.

    |v| clamped to 448; below 2**-6 (E4M3 subnormals) x = 8 + |v| * 2**9 rounded toward zero
    (one FMA.RZ: t = |v|/ulp truncated to 20 fraction bits, with the float32 exponent of [8, 16)),
    else x = |v| (its low 20 bits are frac(t) * 2**20).  Adding 2**20 - 1 - r to the bits of x and
    clearing the low 20 carries exactly when r < frac(t) * 2**20, leaving an E4M3 value (below
    2**-6, (x - 8) * 2**-9, exact); a NaN enters as 0x7FC00000, so it stays NaN; the sign is put
    back and the cast is exact (NaN -> 0x7F with v's sign, as the reference).
    """
    a = tl.minimum(tl.abs(v), 448.0, propagate_nan=tl.PropagateNan.ALL)
    sub = a < 0.015625
    x = tl.where(sub, libdevice.fma_rz(a, 512.0, 8.0), a).to(tl.int32, bitcast=True)
    x = tl.minimum(x, 0x7FC00000)  # any NaN -> the quiet NaN with an empty low field: the carry stays inside
    y = (((x + 0xFFFFF) - r.to(tl.int32)) & -0x100000).to(tl.float32, bitcast=True)
    y = tl.where(sub, tl.fma(y, 0.001953125, -0.015625), y)
    y = (y.to(tl.int32, bitcast=True) | (v.to(tl.int32, bitcast=True) & -0x80000000)).to(tl.float32, bitcast=True)
    return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel launched with ``launch_pdl`` (programmatic dependent launch, sm_90+) starts while its predecessor
    runs: wait here, before any load or store, until the predecessor has finished and its writes are visible, then
    let this kernel's own dependent start launching (it waits likewise).  Only the launch overlaps; nothing else."""
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
    """The 20 random bits (uint32) of flat element index start + off (formats.rounding.uniform:
    u = random20 * 2**-20); start int64 scalar, off int32 >= 0 (a program spans < 2**32 elements).

    c = mix32(hi ^ k1) is a per-program scalar for start's high word and the next one (an
    element whose low word wrapped past start's belongs to the next).  ``WRAP=False`` promises
    that no element's low word wraps (:func:`wraps` on the host), so the hash's first step is one
    multiply-add of off with the program's scalar s_lo * k + c.
    """
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
    """Whether flat indices offset .. offset + n - 1 cross a multiple of 2**32 (random20's WRAP)."""
    return n > 0 and (offset >> 32) != ((offset + n - 1) >> 32)


def stream_key_i32(r: rounding.Rounding) -> tuple[int, int]:
    """The rounding's (k0, k1) as signed int32 values, so Triton types them i32 on every version."""
    return tuple(k - (1 << 32) if k >= 1 << 31 else k for k in rounding.stream_key(r.seed, r.name))  # type: ignore[return-value]


def interpreted() -> bool:
    """True when Triton runs these kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return isinstance(pow2, InterpretedFunction)


def cdiv(a: int, b: int) -> int:
    """Host ceil-division: ``triton.cdiv`` goes through Triton's constexpr-function call machinery,
    about 1-2 us a call, and a launcher asks several per launch."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Host ``triton.next_power_of_2`` (same values, 0 -> 0), without its call machinery."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def compiled_sm90(device: torch.device) -> bool:
    """Whether kernels on ``device`` are compiled for NVIDIA sm_90 or later: where the hardware E4M3 cast is
    exact (:func:`hw_e4m3`) and programmatic dependent launch exists (:func:`pdl_ok`)."""
    return not interpreted() and device.type == "cuda" and torch.version.hip is None and capability(device) >= (9, 0)


def pdl_ok(device: torch.device, requested: bool = True) -> bool:
    """Whether a launch on ``device`` goes as a programmatic dependent (:func:`pdl_enter`): where it was
    ``requested`` and exists (compiled sm_90+); elsewhere the request is dropped, the bytes the same."""
    return requested and compiled_sm90(device)


def hw_e4m3(device: torch.device, requested: bool | None = None) -> bool:
    """Whether kernels on ``device`` round to E4M3 with the hardware cast: where it is exact
    (compiled, NVIDIA sm_90+) unless ``requested`` is False; True where it is not exact raises."""
    exact = compiled_sm90(device)
    if requested and not exact:
        raise ValueError(f"the hardware E4M3 cast is not exact RNE on {device} here (needs compiled Triton on NVIDIA sm_90+)")
    return exact if requested is None else requested


def available(device: torch.device) -> Availability:
    """Compiled kernels: CUDA only, eligible for auto.  Interpreted: any device, explicit only."""
    if interpreted():
        return Availability(True, auto=False, reason="Triton interpreter: only when asked for explicitly")
    if device.type == "cuda":
        return Availability(True)
    return Availability(False, reason=f"compiled Triton kernels need a CUDA device, got {device.type}")


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_input(x: torch.Tensor, what: str) -> None:
    """Layout rules every launcher asserts: a contiguous float tensor."""
    assert x.is_contiguous(), f"{what}: the Triton kernel needs a contiguous tensor, got strides {x.stride()}"
    assert x.dtype in FLOAT_DTYPES, f"{what}: the Triton kernel reads {FLOAT_DTYPES}, got {x.dtype}"
