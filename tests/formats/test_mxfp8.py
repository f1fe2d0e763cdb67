"""MXFP8 (E4M3 elements, one E8M0 scale per 1x32 along K): golden bytes, an independent per-block
reference, decode at extreme scales, error bound, idempotence, sign symmetry, rejected shapes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from quantkit.formats import mxfp8
from quantkit.formats.rounding import Rounding

E4M3_MAX = 448.0


def u8(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def row(values: list[float], k: int = 32) -> list[float]:
    return values + [0.0] * (k - len(values))


def test_golden_bytes() -> None:
    # block 0: amax 3.5 = 1.75*2 -> both rules 2**-7 (byte 120); x * 128: 448 -> 0x7E, 128 -> 0.1110.000 = 0x70,
    #   -256 -> 1.1111.000 = 0xF8, 0.1*128 = 12.8 -> 13 = 1.625*8 -> 0.1010.101 = 0x55, 0 -> 0x00
    # block 1: amax 449 -> rceil 2**1 (byte 128): 224.5 -> 224 = 0.1110.110 = 0x76, -0.5 -> 1.0110.000 = 0xB0
    #                    floor 2**0 (byte 127): 449 saturates to 0x7E, -1 -> 1.0111.000 = 0xB8
    x = torch.tensor([row([3.5, 1.0, -2.0, 0.1]) + row([449.0, -1.0])])
    q, s = mxfp8.quantize(x, "rceil")
    assert s.tolist() == [[120, 128]]
    assert u8(q)[0, :5].tolist() == [0x7E, 0x70, 0xF8, 0x55, 0x00] and u8(q)[0, 32:34].tolist() == [0x76, 0xB0]
    q, s = mxfp8.quantize(x, "floor")
    assert s.tolist() == [[120, 127]]
    assert u8(q)[0, :5].tolist() == [0x7E, 0x70, 0xF8, 0x55, 0x00] and u8(q)[0, 32:34].tolist() == [0x7E, 0xB8]
    assert (u8(q)[0, 34:] == 0).all()


def reference_quantize(x: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block, in python doubles: k from the OCP rule or rceil, elements x / 2**k (exact) cast to E4M3
    after clamping to +-448 (the cast's table is checked in test_fp8.py)."""
    rows, k = x.shape
    q = torch.empty(rows, k, dtype=torch.float8_e4m3fn)
    s = torch.empty(rows, k // 32, dtype=torch.uint8)
    for r in range(rows):
        for b in range(k // 32):
            blk = x[r, 32 * b : 32 * (b + 1)].tolist()
            amax = max(abs(v) for v in blk)
            if amax == 0:
                e = -127
            elif rule == "floor":
                e = math.frexp(amax)[1] - 1 - 8
            else:
                e = math.frexp(amax)[1] - 8  # try the larger power first, step down while it still fits
                while amax <= E4M3_MAX * math.ldexp(1.0, e - 1):
                    e -= 1
            e = max(-127, min(127, e))
            s[r, b] = e + 127
            v = torch.tensor([min(max(t / math.ldexp(1.0, e), -E4M3_MAX), E4M3_MAX) for t in blk], dtype=torch.float64)
            q[r, 32 * b : 32 * (b + 1)] = v.to(torch.float32).to(torch.float8_e4m3fn)
    return q, s


def weights(seed: int, mag: int, rows: int = 3, k: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-8, 8, (rows, k), generator=g).float()) * 2.0**mag


@given(st.integers(0, 2**31), st.integers(-140, 110), st.sampled_from(["rceil", "floor"]))
def test_matches_the_per_block_reference(seed: int, mag: int, rule: str) -> None:
    x = weights(seed, mag)
    q, s = mxfp8.quantize(x, rule)
    rq, rs = reference_quantize(x, rule)
    assert torch.equal(s, rs)
    assert torch.equal(u8(q), u8(rq))


@pytest.mark.parametrize("scale_byte", [0, 1, 126, 127, 128, 254])
def test_every_code_decodes_at_extreme_scales(scale_byte: int) -> None:
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # 254 finite codes
    codes = torch.cat([codes, torch.zeros(2, dtype=torch.uint8)]).view(8, 32)
    vals = codes.view(torch.float8_e4m3fn)
    got = mxfp8.dequantize(vals, torch.full((8, 1), scale_byte, dtype=torch.uint8))
    # python doubles: value * 2**(b - 127) exactly, then one rounding to float32 (inf above the float32 range)
    want = torch.tensor([[v * math.ldexp(1.0, scale_byte - 127) for v in r] for r in vals.double().tolist()]).to(torch.float32)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_nan_scale_makes_the_block_nan() -> None:
    q = torch.zeros(1, 64, dtype=torch.float8_e4m3fn)
    d = mxfp8.dequantize(q, torch.tensor([[0xFF, 127]], dtype=torch.uint8))
    assert torch.isnan(d[0, :32]).all() and (d[0, 32:] == 0).all()


def half_ulp(v: torch.Tensor) -> torch.Tensor:
    e = (torch.frexp(v.abs().double())[1] - 1).clamp(min=-6)
    return torch.ldexp(torch.ones_like(v, dtype=torch.float64), e - 4)


@given(st.integers(0, 2**31), st.integers(-140, 110), st.sampled_from(["rceil", "floor"]))
def test_round_trip_error_bound(seed: int, mag: int, rule: str) -> None:
    x = weights(seed, mag)
    q, s = mxfp8.quantize(x, rule)
    d = mxfp8.dequantize(q, s).double()
    sc = torch.ldexp(torch.ones(s.shape, dtype=torch.float64), s.long() - 127).repeat_interleave(32, -1)
    v = x.double() / sc
    sat = v.abs() > E4M3_MAX
    if rule == "rceil":
        assert not sat.any()
    err = (d - x.double()).abs()
    bad = (err > half_ulp(v) * sc) & ~sat
    assert not bad.any(), f"worst block {divmod(int(bad.flatten().nonzero()[0]), x.shape[1])}"
    assert torch.equal(d[sat], torch.copysign(E4M3_MAX * sc[sat], x.double()[sat]))


@given(st.integers(0, 2**31), st.integers(-140, 110), st.sampled_from(["nearest", "stochastic"]))
def test_idempotent_bytes_with_floor_rule(seed: int, mag: int, mode: str) -> None:
    # floor: amax / 2**k in [256, 512), so the dequantized amax keeps k; the elements are then
    # representable, and stochastic rounding (any seed) leaves representable values alone
    q, s = mxfp8.quantize(weights(seed, mag), "floor", Rounding(mode, seed=seed, name="w"))
    q2, s2 = mxfp8.quantize(mxfp8.dequantize(q, s), "floor", Rounding(mode, seed=seed + 1, name="w"))
    assert torch.equal(s2, s) and torch.equal(u8(q2), u8(q))


@given(st.integers(0, 2**31), st.integers(-140, 110))
def test_idempotent_values_with_rceil_rule(seed: int, mag: int) -> None:
    q, s = mxfp8.quantize(weights(seed, mag), "rceil")
    d = mxfp8.dequantize(q, s)
    assert torch.equal(mxfp8.dequantize(*mxfp8.quantize(d, "rceil")), d)


def test_rceil_bytes_are_not_idempotent() -> None:
    # amax 225: 2**ceil(log2(225/448)) = 1, 225 -> 224 (0x76); then amax 224 -> 2**-1, 448 (0x7E), 1 -> 2 (0x40)
    x = torch.tensor([row([225.0, 1.0])])
    q, s = mxfp8.quantize(x)
    assert s.tolist() == [[127]] and u8(q)[0, :2].tolist() == [0x76, 0x38]
    q2, s2 = mxfp8.quantize(mxfp8.dequantize(q, s))
    assert s2.tolist() == [[126]] and u8(q2)[0, :2].tolist() == [0x7E, 0x40]
    assert torch.equal(mxfp8.dequantize(q2, s2), mxfp8.dequantize(q, s))


@given(st.integers(0, 2**31), st.integers(-140, 110), st.sampled_from(["nearest", "stochastic"]))
def test_sign_symmetry(seed: int, mag: int, mode: str) -> None:
    x = weights(seed, mag)
    r = Rounding(mode, seed=seed, name="w")
    q, s = mxfp8.quantize(x, rounding=r)
    qn, sn = mxfp8.quantize(-x, rounding=r)
    assert torch.equal(sn, s) and torch.equal(u8(qn), u8(q) ^ 0x80)


def test_stacked_leading_dims() -> None:
    x = weights(1, 0, rows=6, k=96).view(2, 3, 96)
    q, s = mxfp8.quantize(x)
    assert q.shape == (2, 3, 96) and s.shape == (2, 3, 3)
    q2, s2 = mxfp8.quantize(x.view(6, 96))
    assert torch.equal(u8(q).view(6, 96), u8(q2)) and torch.equal(s.view(6, 3), s2)


def test_rejected_inputs() -> None:
    with pytest.raises(ValueError, match="multiple of 32, got 48"):
        mxfp8.quantize(torch.zeros(2, 48))
    q = torch.zeros(2, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="does not fit elements"):
        mxfp8.dequantize(q, torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="does not fit elements"):
        mxfp8.dequantize(q, torch.zeros(3, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="scale rule must be one of"):
        mxfp8.quantize(torch.zeros(2, 32), rule="nearest")
