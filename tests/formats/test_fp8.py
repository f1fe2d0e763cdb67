"""FP8 E4M3 elements: every code against the OCP table, golden bytes, nearest-even, saturation, error bound, sign symmetry."""

from __future__ import annotations

import bisect
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from quantkit.formats import fp8, fp8_block, mxfp8
from quantkit.formats.rounding import Rounding

NAN = math.nan
# OCP FP8 E4M3 (fn: no Inf): bias 7, codes 0SEEEEMMM.  Exponent field 0 is subnormal m * 2**-9;
# S.1111.111 is NaN, so the largest value is 1.75 * 2**8 = 448.  Row = exponent field, column = mantissa.
E4M3_POS = [
    0.0, 0.001953125, 0.00390625, 0.005859375, 0.0078125, 0.009765625, 0.01171875, 0.013671875,  # 0000
    0.015625, 0.017578125, 0.01953125, 0.021484375, 0.0234375, 0.025390625, 0.02734375, 0.029296875,  # 0001
    0.03125, 0.03515625, 0.0390625, 0.04296875, 0.046875, 0.05078125, 0.0546875, 0.05859375,  # 0010
    0.0625, 0.0703125, 0.078125, 0.0859375, 0.09375, 0.1015625, 0.109375, 0.1171875,  # 0011
    0.125, 0.140625, 0.15625, 0.171875, 0.1875, 0.203125, 0.21875, 0.234375,  # 0100
    0.25, 0.28125, 0.3125, 0.34375, 0.375, 0.40625, 0.4375, 0.46875,  # 0101
    0.5, 0.5625, 0.625, 0.6875, 0.75, 0.8125, 0.875, 0.9375,  # 0110
    1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,  # 0111
    2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75,  # 1000
    4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5,  # 1001
    8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,  # 1010
    16.0, 18.0, 20.0, 22.0, 24.0, 26.0, 28.0, 30.0,  # 1011
    32.0, 36.0, 40.0, 44.0, 48.0, 52.0, 56.0, 60.0,  # 1100
    64.0, 72.0, 80.0, 88.0, 96.0, 104.0, 112.0, 120.0,  # 1101
    128.0, 144.0, 160.0, 176.0, 192.0, 208.0, 224.0, 240.0,  # 1110
    256.0, 288.0, 320.0, 352.0, 384.0, 416.0, 448.0, NAN,  # 1111
]  # fmt: skip
E4M3_TABLE = E4M3_POS + [-v for v in E4M3_POS]  # bit 7 is the sign (code 0x80 is -0.0)
FINITE_POS = E4M3_POS[:127]  # sorted ascending, codes 0x00..0x7E

# Golden bytes, each derived by hand (nearest, ties to even):
GOLDEN = [
    (1.0, 0x38),  # 0 0111 000
    (-2.0, 0xC0),  # 1 1000 000
    (448.0, 0x7E),  # 0 1111 110: the max
    (500.0, 0x7E),  # saturates
    (-1e6, 0xFE),  # saturates, negative
    (2.0**-9, 0x01),  # smallest subnormal 0 0000 001
    (2.0**-10, 0x00),  # half the smallest subnormal: tie -> even (0)
    (3 * 2.0**-10, 0x02),  # 1.5 subnormal ulps: tie -> even (2 * 2**-9)
    (1.0625, 0x38),  # halfway 1.0 / 1.125: tie -> even mantissa 000
    (1.1875, 0x3A),  # halfway 1.125 / 1.25: tie -> even mantissa 010
    (0.1, 0x1D),  # 0.1 = 1.6 * 2**-4: grid step 2**-7 -> 12.8 steps above 0.0625 -> 13: 0 0011 101
    (300.0, 0x79),  # 288 < 300 < 320, nearer 288 = 1.125 * 2**8: 0 1111 001
    (-0.0, 0x80),
    (0.0, 0x00),
]


def e4m3_half_ulp(v: float) -> float:
    """Half the E4M3 spacing around |v| (subnormal spacing 2**-9 below 2**-6)."""
    e = max(math.frexp(abs(v))[1] - 1, -6) if v else -6
    return math.ldexp(1.0, e - 3) / 2


def nearest_even_code(v: float) -> int:
    """Reference E4M3 rounding from the table: nearest finite value, ties to the even code, saturating."""
    a = abs(v)
    if a >= 448.0:
        code = 0x7E
    else:
        i = bisect.bisect_left(FINITE_POS, a)
        if FINITE_POS[i] == a:
            code = i
        else:
            lo, hi = FINITE_POS[i - 1], FINITE_POS[i]
            code = i - 1 if (a - lo < hi - a or (a - lo == hi - a and (i - 1) % 2 == 0)) else i
    return code | (0x80 if math.copysign(1.0, v) < 0 else 0)


def as_bytes(q: torch.Tensor) -> list[int]:
    return q.view(torch.uint8).flatten().tolist()


def assert_matches_table(got: torch.Tensor) -> None:
    want = torch.tensor(E4M3_TABLE, dtype=torch.float64)
    g = got.double().flatten()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(g), nan)
    assert torch.equal(g[~nan], want[~nan])
    assert torch.equal(torch.signbit(g[~nan]), torch.signbit(want[~nan]))  # -0.0 at 0x80


def test_every_code_decodes_to_the_table() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    assert_matches_table(codes.view(torch.float8_e4m3fn).to(torch.float32))
    # quantkit's two dequantizers at unit scale decode the same way
    assert_matches_table(mxfp8.dequantize(codes.view(torch.float8_e4m3fn).view(8, 32), torch.full((8, 1), 127, dtype=torch.uint8)))
    assert_matches_table(fp8_block.dequantize_weight(codes.view(torch.float8_e4m3fn).view(1, 256), torch.ones(1, 2)))


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_every_finite_code_round_trips(mode: str) -> None:
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    vals = codes.view(torch.float8_e4m3fn).to(torch.float32)
    q = fp8.round_e4m3(vals, Rounding(mode, seed=3, name="t"))
    assert as_bytes(q) == codes.tolist()


def test_golden_bytes() -> None:
    v = torch.tensor([x for x, _ in GOLDEN], dtype=torch.float32)
    assert as_bytes(fp8.round_e4m3(v)) == [b for _, b in GOLDEN]


def test_reference_rounding_agrees_with_golden() -> None:
    # the table-driven reference used below must itself reproduce the hand-derived bytes
    assert [nearest_even_code(float(torch.tensor(x, dtype=torch.float32))) for x, _ in GOLDEN] == [b for _, b in GOLDEN]


def test_midpoints_go_to_the_even_code_and_their_neighbours_do_not() -> None:
    lo = torch.tensor(FINITE_POS[:-1], dtype=torch.float32)
    hi = torch.tensor(FINITE_POS[1:], dtype=torch.float32)
    mid = (lo + hi) / 2  # exact: at most 5 significant bits
    code = torch.arange(126)
    even = torch.where(code % 2 == 0, code, code + 1)
    assert as_bytes(fp8.round_e4m3(mid)) == even.tolist()
    assert as_bytes(fp8.round_e4m3(-mid)) == (even | 0x80).tolist()
    below = torch.nextafter(mid, torch.zeros_like(mid))
    above = torch.nextafter(mid, torch.full_like(mid, 1e9))
    assert as_bytes(fp8.round_e4m3(below)) == code.tolist()
    assert as_bytes(fp8.round_e4m3(above)) == (code + 1).tolist()


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_saturation_to_448(mode: str) -> None:
    big = torch.tensor([448.0, 449.0, 464.0, 479.99, 480.0, 1e6, 3.4e38, math.inf])
    r = Rounding(mode, seed=1, name="sat")
    assert as_bytes(fp8.round_e4m3(big, r)) == [0x7E] * 8
    assert as_bytes(fp8.round_e4m3(-big, r)) == [0xFE] * 8


def test_nan_stays_nan() -> None:
    q = fp8.round_e4m3(torch.tensor([math.nan, -math.nan]))
    assert torch.isnan(q.to(torch.float32)).all()


f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
in_range = st.floats(min_value=-448.0, max_value=448.0, width=32)


@given(st.lists(f32, min_size=1, max_size=64))
def test_nearest_matches_the_table_reference(xs: list[float]) -> None:
    q = fp8.round_e4m3(torch.tensor(xs, dtype=torch.float32))
    assert as_bytes(q) == [nearest_even_code(x) for x in xs]


@given(st.lists(in_range, min_size=1, max_size=64))
def test_nearest_error_is_at_most_half_an_ulp(xs: list[float]) -> None:
    q = fp8.round_e4m3(torch.tensor(xs)).double().tolist()
    for x, y in zip(xs, q):
        assert abs(y - x) <= e4m3_half_ulp(x), (x, y)


@given(st.lists(f32, min_size=1, max_size=64), st.sampled_from(["nearest", "stochastic"]), st.integers(0, 2**31))
def test_sign_symmetry(xs: list[float], mode: str, seed: int) -> None:
    r = Rounding(mode, seed=seed, name="w")
    x = torch.tensor(xs)
    pos = torch.tensor(as_bytes(fp8.round_e4m3(x, r)))
    neg = torch.tensor(as_bytes(fp8.round_e4m3(-x, r)))
    assert torch.equal(neg, pos ^ 0x80)


@given(st.lists(in_range, min_size=1, max_size=64), st.integers(0, 2**31))
def test_stochastic_picks_one_of_the_two_neighbours(xs: list[float], seed: int) -> None:
    q = fp8.round_e4m3(torch.tensor(xs), Rounding("stochastic", seed=seed, name="w")).double().tolist()
    for x, y in zip(xs, q):
        a = abs(x)
        i = bisect.bisect_left(FINITE_POS, a)
        allowed = {FINITE_POS[i]} if FINITE_POS[i] == a else {FINITE_POS[i - 1], FINITE_POS[i]}
        assert abs(y) in allowed and (y == 0 or math.copysign(1, y) == math.copysign(1, x)), (x, y)
