"""MXFP4 (GPT-OSS blocks/scales): every E2M1 code and nibble order against the OCP table, decode bit-exact
against transformers' dequantizer, golden encode bytes, round-trip error bound, idempotence, sign symmetry."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from quantkit.formats import mxfp4

# OCP MX v1.0 FP4 E2M1: bit 3 sign, 2 exponent bits (bias 1), 1 mantissa bit; no Inf/NaN.
#   code: 0    1    2    3    4    5    6    7    8     9     10    11    12    13    14    15
E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
EXTREME_SCALES = [0, 1, 126, 127, 128, 129, 130, 254]


def bits(t: torch.Tensor) -> torch.Tensor:
    """Same-width integer view, so -0.0 != 0.0 and NaN == NaN compare as bits."""
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def test_every_packed_byte_decodes_low_nibble_first() -> None:
    packed = torch.arange(256, dtype=torch.uint8).view(16, 16)  # 16 rows, one block of 32 each
    got = mxfp4.decode(packed.view(16, 1, 16), torch.full((16, 1), 127, dtype=torch.uint8))  # scale 2**0
    for b in range(256):
        lo, hi = got.view(-1)[2 * b].item(), got.view(-1)[2 * b + 1].item()
        assert (lo, hi) == (E2M1_TABLE[b & 0xF], E2M1_TABLE[b >> 4]), f"byte {b:#04x}"
        assert math.copysign(1, lo) == math.copysign(1, E2M1_TABLE[b & 0xF])


def test_format_constant_is_the_table() -> None:
    got = mxfp4.lut()
    assert torch.equal(bits(got), bits(torch.tensor(E2M1_TABLE)))


def test_pack_unpack_golden() -> None:
    assert mxfp4.unpack(torch.tensor([0x21, 0xF0], dtype=torch.uint8)).tolist() == [1, 2, 0, 15]
    assert mxfp4.pack(torch.tensor([1, 2, 0, 15], dtype=torch.uint8)).tolist() == [0x21, 0xF0]
    every = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(mxfp4.pack(mxfp4.unpack(every)), every)


def gpt_oss_blocks(gen: torch.Generator, e: int = 2, out: int = 8, g: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, out, G, 16] bytes holding every byte value (so every code in both nibbles) and
    [E, out, G] scales holding the extreme exponents."""
    n = e * out * g * 16
    raw = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
    raw[:256] = torch.randperm(256, generator=gen).to(torch.uint8)
    sc = torch.randint(0, 255, (e * out * g,), generator=gen, dtype=torch.uint8)  # 0xFF (NaN) excluded
    sc[: len(EXTREME_SCALES)] = torch.tensor(EXTREME_SCALES, dtype=torch.uint8)
    sc = sc[torch.randperm(len(sc), generator=gen)]
    return raw.view(e, out, g, 16), sc.view(e, out, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_bit_exact_against_transformers(dtype: torch.dtype, seed: int) -> None:
    blocks, scales = gpt_oss_blocks(torch.Generator().manual_seed(seed))
    ref = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [E, in, out]: transposed
    ours = mxfp4.decode(blocks, scales, dtype=dtype).transpose(1, 2)
    assert ours.shape == ref.shape == (2, 128, 8)
    same = bits(ours.contiguous()) == bits(ref)
    if not same.all():
        e, i, o = (int(x) for x in (~same).nonzero()[0])
        pytest.fail(f"first mismatch: expert {e}, out row {o}, block {i // 32} (scale {scales[e, o, i // 32]}): "
                    f"ours {ours[e, i, o].item()} vs transformers {ref[e, i, o].item()}")


def test_nan_scale_makes_the_block_nan() -> None:
    blocks = torch.zeros(2, 1, 16, dtype=torch.uint8)
    out = mxfp4.decode(blocks, torch.tensor([[0xFF], [127]], dtype=torch.uint8))
    assert torch.isnan(out[0]).all() and (out[1] == 0).all()


def row(values: list[float]) -> torch.Tensor:
    return torch.tensor(values + [0.0] * (32 - len(values)), dtype=torch.float32)


def test_golden_encode_bytes() -> None:
    # row 0, scale 2 (amax 12: rceil ceil(log2(12/6)) = 1; floor floor(log2 12) - 2 = 1 -> byte 128):
    #   values / 2 = 0 .5 1 1.5 2 3 4 6 -0 -.5 ... -6 -> codes 0..15 -> bytes 0x10 0x32 ... 0xFE, then zeros
    r0 = row([0, 1, 2, 3, 4, 6, 8, 12, -0.0, -1, -2, -3, -4, -6, -8, -12])
    # row 1, scale 1 (amax 6): ties to even code: .25->0, .75->1 (2), 1.25->1 (2), 1.75->2 (4),
    #   2.5->2 (4), 3.5->4 (6), 5->4 (6), 6->6 (7); negatives get bit 3 (-0.25 -> -0, code 8)
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    r1 = row(ties + [-v for v in ties])
    # row 2, scale 1 (amax 6): .3 -> .5 (1), 2.9 -> 3 (5), 4.9 -> 4 (6), 5.1 -> 6 (7)
    r2 = row([0.3, 2.9, 4.9, 5.1, 6.0])
    blocks, scales = mxfp4.encode(torch.stack([r0, r1, r2]))
    assert scales.tolist() == [[128], [127], [127]]
    assert blocks[0, 0].tolist() == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] + [0] * 8
    assert blocks[1, 0].tolist() == [0x20, 0x42, 0x64, 0x76, 0xA8, 0xCA, 0xEC, 0xFE] + [0] * 8
    assert blocks[2, 0].tolist() == [0x51, 0x76, 0x07] + [0] * 13


def test_golden_encode_bytes_scale_rules() -> None:
    # amax 7 = 1.75*2**2.  rceil: 2**ceil(log2(7/6)) = 2, 7/2 = 3.5 -> tie -> 4 (code 6), 1/2 -> code 1: 0x16
    #                      floor: 2**(2 - 2) = 1, 7 saturates to 6 (code 7), 1 -> code 2: 0x27
    w = row([7.0, 1.0]).unsqueeze(0)
    b, s = mxfp4.encode(w, "rceil")
    assert s.tolist() == [[128]] and b[0, 0, 0].item() == 0x16
    b, s = mxfp4.encode(w, "floor")
    assert s.tolist() == [[127]] and b[0, 0, 0].item() == 0x27


def half_ulp(v: torch.Tensor) -> torch.Tensor:
    """Half the E2M1 spacing at |v|: 0.25 below 2, 0.5 below 4, 1 up to 6."""
    a = v.abs()
    return torch.where(a < 2, 0.25, torch.where(a < 4, 0.5, 1.0)).double()


def weights(seed: int, mag: int, rows: int = 3, k: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-4, 4, (rows, k), generator=g).float())
    return w * 2.0**mag


@given(st.integers(0, 2**31), st.integers(-100, 100), st.sampled_from(["rceil", "floor"]))
def test_round_trip_error_bound(seed: int, mag: int, rule: str) -> None:
    w = weights(seed, mag)
    blocks, scales = mxfp4.encode(w, rule)
    d = mxfp4.decode(blocks, scales).double()
    x = torch.ldexp(torch.ones(scales.shape, dtype=torch.float64), scales.long() - 127).repeat_interleave(32, -1)
    v = w.double() / x
    sat = v.abs() > 6
    if rule == "rceil":
        assert not sat.any()  # rceil never clips
    err = (d - w.double()).abs()
    assert (err[~sat] <= (half_ulp(v) * x)[~sat]).all()
    assert torch.equal(d[sat], torch.copysign(6 * x[sat], w.double()[sat]))


@given(st.integers(0, 2**31), st.integers(-100, 100))
def test_idempotent_bytes_with_floor_rule(seed: int, mag: int) -> None:
    # floor: amax / X in [4, 8) -> the largest code is 4 or 6, so the dequantized amax keeps the scale
    blocks, scales = mxfp4.encode(weights(seed, mag), "floor")
    b2, s2 = mxfp4.encode(mxfp4.decode(blocks, scales), "floor")
    assert torch.equal(s2, scales) and torch.equal(b2, blocks)


@given(st.integers(0, 2**31), st.integers(-100, 100))
def test_idempotent_values_with_rceil_rule(seed: int, mag: int) -> None:
    blocks, scales = mxfp4.encode(weights(seed, mag), "rceil")
    d = mxfp4.decode(blocks, scales)
    assert torch.equal(mxfp4.decode(*mxfp4.encode(d, "rceil")), d)


def test_rceil_bytes_are_not_idempotent() -> None:
    # amax 3.25: X = 2**ceil(log2(3.25/6)) = 1; 3.25 -> 3 (code 5), 1 -> code 2: byte 0x25.
    # Dequantized amax 3: X' = 2**ceil(log2(0.5)) = 0.5; 3/.5 = 6 (code 7), 1/.5 = 2 (code 4): 0x47.
    w = row([3.25, 1.0]).unsqueeze(0)
    b, s = mxfp4.encode(w)
    assert s.tolist() == [[127]] and b[0, 0, 0].item() == 0x25
    b2, s2 = mxfp4.encode(mxfp4.decode(b, s))
    assert s2.tolist() == [[126]] and b2[0, 0, 0].item() == 0x47
    assert torch.equal(mxfp4.decode(b2, s2), mxfp4.decode(b, s))


@given(st.integers(0, 2**31), st.integers(-100, 100), st.sampled_from(["rceil", "floor"]))
def test_sign_symmetry(seed: int, mag: int, rule: str) -> None:
    w = weights(seed, mag)
    b, s = mxfp4.encode(w, rule)
    bn, sn = mxfp4.encode(-w, rule)
    assert torch.equal(sn, s) and torch.equal(bn, b ^ 0x88)


def test_zero_and_nan_blocks() -> None:
    w = torch.stack([row([]), row([math.nan, 1.0])])
    b, s = mxfp4.encode(w)
    assert s.tolist() == [[0], [0xFF]]  # zero block: byte 0 (2**-127); NaN amax: the NaN byte
    assert (b[0] == 0).all()
    d = mxfp4.decode(b, s)
    assert (d[0] == 0).all() and torch.isnan(d[1]).all()


def test_stacked_expert_shapes() -> None:
    w = weights(0, 0, rows=6, k=96).view(2, 3, 96)
    b, s = mxfp4.encode(w)
    assert b.shape == (2, 3, 3, 16) and s.shape == (2, 3, 3)
    assert torch.equal(mxfp4.decode(b, s), torch.stack([mxfp4.decode(*mxfp4.encode(w[i])) for i in range(2)]))


def test_rejected_inputs() -> None:
    with pytest.raises(ValueError, match="multiple of 32, got 48"):
        mxfp4.encode(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="do not match"):
        mxfp4.decode(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not match"):
        mxfp4.decode(torch.zeros(2, 3, 8, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8))


def _mean_bias(rounding_of_seed) -> tuple[float, float]:
    """Rounds the same block values with 400 roundings and returns (mean signed error, worst
    per-element |mean error|), both in units of the local E2M1 step at each element."""
    g = torch.Generator().manual_seed(11)
    x = torch.rand(64, 32, generator=g) * 6
    x[:, 0] = 6.0  # each block's amax is 6: scale 2**0 under either rule, so only element rounding acts
    x[:, 1:] *= torch.where(torch.rand(64, 31, generator=g) < 0.5, -1.0, 1.0)
    mean = torch.stack([mxfp4.decode(*mxfp4.encode(x, rounding=rounding_of_seed(s))) for s in range(400)]).mean(0)
    step = torch.where(x.abs() < 2, 0.5, torch.where(x.abs() < 4, 1.0, 2.0))
    err = (mean - x) / step
    return float(err.abs().mean()), float(err.abs().max())


def test_stochastic_rounding_is_unbiased_and_nearest_is_not() -> None:
    from quantkit.formats.rounding import Rounding

    # 400 draws: the mean of a Bernoulli(f) step has std <= 0.025 steps; 2048 elements, worst of them ~4.5 std
    avg, worst = _mean_bias(lambda s: Rounding("stochastic", s, "w"))
    assert avg < 0.03 and worst < 0.13, (avg, worst)
    avg, worst = _mean_bias(lambda s: Rounding())  # nearest: every draw alike, the bias stays
    assert avg > 0.15 and worst > 0.4, (avg, worst)


def test_stochastic_rounding_lands_on_a_neighbour() -> None:
    from quantkit.formats.rounding import Rounding

    x = torch.tensor([[6.0, 0.2, 0.74, 1.3, 2.5, -3.3, 4.9, 5.99, -0.0, 0.5] + [0.0] * 22])
    lo = torch.tensor([[6.0, 0.0, 0.5, 1.0, 2.0, -3.0, 4.0, 4.0, -0.0, 0.5] + [0.0] * 22])
    hi = torch.tensor([[6.0, 0.5, 1.0, 1.5, 3.0, -4.0, 6.0, 6.0, -0.0, 0.5] + [0.0] * 22])
    for s in range(50):
        y = mxfp4.decode(*mxfp4.encode(x, rounding=Rounding("stochastic", s, "t")))
        assert bool(((y == lo) | (y == hi)).all()), y
