"""E8M0 scales: every byte against the OCP MX v1.0 table, and the floor / rceil rules on hand-picked amax values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from quantkit.formats import e8m0

# OCP MX v1.0, E8M0: byte b encodes 2**(b - 127) for b in 0..254, 0xFF is NaN.  No zero, no sign.
# The rule is the table; python's float ldexp is exact for every entry (all are normal doubles).
E8M0_TABLE = [math.ldexp(1.0, b - 127) for b in range(255)] + [math.nan]
# Anchors written out, so the formula above cannot drift unnoticed.
E8M0_ANCHORS = {
    0x00: 5.877471754111438e-39,  # 2**-127 (a float32 subnormal, not zero)
    0x01: 1.1754943508222875e-38,  # 2**-126, the smallest float32 normal
    0x7E: 0.5,
    0x7F: 1.0,
    0x80: 2.0,
    0x86: 128.0,
    0xFE: 1.7014118346046923e38,  # 2**127
}

F32_MAX = 3.4028234663852886e38
ABOVE_1_75 = 1.7500001192092896  # nextafter(1.75, inf) in float32: mantissa 1.75 + 2**-23
ABOVE_1_5 = 1.5000001192092896

# (amax, element, floor exponent, rceil exponent), each derived by hand:
#   floor: k = floor(log2 amax) - e_max              (e_max: E4M3 8, E2M1 2)
#   rceil: k = ceil(log2(amax / max))                (max: E4M3 448 = 1.75*2**8, E2M1 6 = 1.5*2**2)
#   both clamped to [-127, 127]; amax 0 -> -127 (byte 0); NaN / Inf -> byte 0xFF.
SCALE_CASES = [
    (448.0, "e4m3", 0, 0),  # 448 = 1.75*2**8; 448/448 = 1 -> ceil(log2) = 0
    (449.0, "e4m3", 0, 1),  # 449 = 1.75390625*2**8; 449/448 > 1 -> 1
    (1.75, "e4m3", -8, -8),  # mantissa exactly 1.75: 1.75/448 = 2**-8 exactly
    (ABOVE_1_75, "e4m3", -8, -7),  # one ulp above: rceil moves up, floor does not
    (6.0, "e4m3", -6, -6),  # 6 = 1.5*2**2; 6/448 = 0.0134 -> log2 = -6.22 -> -6
    (6.5, "e4m3", -6, -6),  # 6.5 = 1.625*2**2 (1.625 < 1.75)
    (7.0, "e4m3", -6, -6),  # 7 = 1.75*2**2 -> 7/448 = 2**-6
    (3.0, "e4m3", -7, -7),  # 3 = 1.5*2; 3/448 -> log2 = -7.22 -> -7
    (F32_MAX, "e4m3", 119, 120),  # (2 - 2**-23)*2**127
    (2.0**-119, "e4m3", -127, -127),  # floor: -119 - 8 = -127 (byte 0); rceil: 2**-119/448 -> -127.8 -> -127
    (2.0**-118, "e4m3", -126, -126),
    (6.0, "e2m1", 0, 0),  # 6 = 1.5*2**2 -> 6/6 = 1
    (6.5, "e2m1", 0, 1),  # 1.625 > 1.5: only rceil moves up
    (1.5, "e2m1", -2, -2),
    (ABOVE_1_5, "e2m1", -2, -1),
    (3.0, "e2m1", -1, -1),  # 3/6 = 0.5
    (448.0, "e2m1", 6, 7),  # 448 = 1.75*2**8: 8 - 2 = 6; 448/6 = 74.7 -> log2 = 6.22 -> 7
    (F32_MAX, "e2m1", 125, 126),
    (0.0, "e4m3", -127, -127),
    (0.0, "e2m1", -127, -127),
    (2.0**-140, "e4m3", -127, -127),  # float32 subnormal amax: clamped to the smallest scale
    (1.401298464324817e-45, "e2m1", -127, -127),  # the smallest subnormal, 2**-149
    (1.1754942106924411e-38, "e4m3", -127, -127),  # the largest subnormal, (1 - 2**-23)*2**-126
]


def test_every_byte_decodes_to_the_ocp_table() -> None:
    got = e8m0.decode(torch.arange(256, dtype=torch.uint8)).double()
    want = torch.tensor(E8M0_TABLE, dtype=torch.float64)
    assert torch.isnan(got[255])
    assert torch.equal(got[:255], want[:255])
    for b, v in E8M0_ANCHORS.items():
        assert got[b].item() == v, f"byte {b:#04x}"


def test_decode_accepts_float8_e8m0fnu_and_agrees_with_torch() -> None:
    raw = torch.arange(256, dtype=torch.uint8)
    as_e8m0 = raw.view(torch.float8_e8m0fnu)
    ours = e8m0.decode(as_e8m0)
    torchs = as_e8m0.to(torch.float32)  # torch's own decoder, an independent judge
    assert torch.equal(ours[:255], torchs[:255])
    assert torch.isnan(ours[255]) and torch.isnan(torchs[255])


def test_pow2_is_exact_over_the_whole_range() -> None:
    k = torch.arange(-127, 128)
    want = torch.tensor([math.ldexp(1.0, int(i)) for i in k], dtype=torch.float64)
    assert torch.equal(e8m0.pow2(k).double(), want)
    assert torch.equal(e8m0.decode(e8m0.to_bytes(k)), e8m0.pow2(k))


def test_to_bytes_ends() -> None:
    got = e8m0.to_bytes(torch.tensor([-127, 0, 127, 128], dtype=torch.int32))
    assert got.tolist() == [0x00, 0x7F, 0xFE, 0xFF]
    assert got.dtype == torch.uint8


@pytest.mark.parametrize("rule", e8m0.RULES)
@pytest.mark.parametrize(("amax", "element", "k_floor", "k_rceil"), SCALE_CASES)
def test_scale_rule_on_hand_picked_amax(amax: float, element: str, k_floor: int, k_rceil: int, rule: str) -> None:
    want = k_floor if rule == "floor" else k_rceil
    a = torch.tensor([amax], dtype=torch.float32)
    assert e8m0.exponent(a, element, rule).tolist() == [want]
    assert e8m0.encode(a, element, rule).tolist() == [want + 127]


@pytest.mark.parametrize("rule", e8m0.RULES)
@pytest.mark.parametrize("element", ["e4m3", "e2m1"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_amax_gives_the_nan_byte(bad: float, element: str, rule: str) -> None:
    a = torch.tensor([bad, 1.0])
    assert e8m0.encode(a, element, rule).tolist() == [0xFF, 127 - (8 if element == "e4m3" else 2)]
    assert torch.isnan(e8m0.decode(e8m0.encode(a, element, rule))[0])


def test_exponent_reads_bf16_and_noncontiguous_input() -> None:
    a = torch.tensor([[448.0, 6.0], [449.0, 0.0]]).t()  # non-contiguous view
    assert e8m0.exponent(a, "e4m3", "rceil").tolist() == [[0, 1], [-6, -127]]
    assert e8m0.exponent(a.to(torch.bfloat16), "e4m3", "floor").tolist() == [[0, 0], [-6, -127]]


def test_not_the_float8_e8m0fnu_cast() -> None:
    """The cast rounds to the nearest power of two (1.5 -> 2, 3 -> 4); neither scale rule does.

    For r = amax / 448 (amax = 448 r exactly):
      r       amax   rceil 2**ceil(log2 r)   floor 2**(floor(log2 amax) - 8)   cast
      0.5625   252   1   (byte 127)          0.5 (252 = 1.96875*2**7: 126)      0.5 (126): clips 504 -> 448
      1.25     560   2   (128)               2   (560 = 1.09375*2**9: 128)      1   (127): clips 560 -> 448
      1.5      672   2   (128)               2   (128)                          2   (128)
      3.0     1344   4   (129)               4   (1344 = 1.3125*2**10: 129)     4   (129)
      5.0     2240   8   (130)               8   (2240 = 1.09375*2**11: 130)    4   (129): clips 560 -> 448
    """
    ratios = torch.tensor([0.5625, 1.25, 1.5, 3.0, 5.0])
    amax = ratios * 448.0  # exact
    cast = ratios.to(torch.float8_e8m0fnu).view(torch.uint8)
    assert cast.tolist() == [126, 127, 128, 129, 129]  # what torch does
    rceil = e8m0.encode(amax, "e4m3", "rceil")
    floor = e8m0.encode(amax, "e4m3", "floor")
    assert rceil.tolist() == [127, 128, 128, 129, 130]
    assert floor.tolist() == [126, 128, 128, 129, 130]
    # rceil never clips where the cast does: amax / scale <= 448 for every block
    assert (amax / e8m0.decode(rceil) <= 448).all() and not (amax / e8m0.decode(cast) <= 448).all()
    # an amax of 3.0 for E2M1 gets the rceil exponent -1 (3/6 = 0.5), not the cast's 2**2 = 4
    assert e8m0.encode(torch.tensor([3.0]), "e2m1", "rceil").tolist() == [126]
    assert torch.tensor([3.0]).to(torch.float8_e8m0fnu).view(torch.uint8).tolist() == [129]


ELEMENT_MAX = {"e4m3": 448.0, "e2m1": 6.0}
# amax range where neither clamp of the exponent applies (the ends are covered by SCALE_CASES)
normal_amax = st.floats(min_value=2.0**-100, max_value=F32_MAX, width=32)


@given(amax=normal_amax, element=st.sampled_from(["e4m3", "e2m1"]))
def test_rceil_is_the_smallest_power_of_two_that_never_clips(amax: float, element: str) -> None:
    k = e8m0.exponent(torch.tensor([amax]), element, "rceil").item()
    mx = ELEMENT_MAX[element]
    assert amax <= mx * math.ldexp(1.0, k)  # python doubles: exact for these operands
    assert amax > mx * math.ldexp(1.0, k - 1)


@given(amax=normal_amax, element=st.sampled_from(["e4m3", "e2m1"]))
def test_floor_puts_amax_in_the_top_binade(amax: float, element: str) -> None:
    k = e8m0.exponent(torch.tensor([amax]), element, "floor").item()
    e_max = 8 if element == "e4m3" else 2
    v = amax / math.ldexp(1.0, k)
    assert 2.0**e_max <= v < 2.0 ** (e_max + 1)


@given(amax=normal_amax, element=st.sampled_from(["e4m3", "e2m1"]))
def test_rules_differ_only_above_the_element_mantissa(amax: float, element: str) -> None:
    a = torch.tensor([amax])
    kf = e8m0.exponent(a, element, "floor").item()
    kr = e8m0.exponent(a, element, "rceil").item()
    mant = math.frexp(amax)[0] * 2  # in [1, 2)
    m_max = 1.75 if element == "e4m3" else 1.5
    assert kr - kf == (1 if mant > m_max else 0)


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="scale rule must be one of"):
        e8m0.exponent(torch.tensor([1.0]), "e4m3", "nearest")
    with pytest.raises(ValueError, match="scale rule must be one of"):
        e8m0.check_rule("ceil")
