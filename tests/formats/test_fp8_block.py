"""FP8-block (128x128 weight tiles, 1x128 activation groups) against DeepSeek-V3's published rules,
re-implemented here as plain loops over tiles (inference/kernel.py weight_dequant and act_quant,
fp8_cast_bf16.py), plus golden bytes, error bounds, idempotence and sign symmetry."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from quantkit.formats import fp8_block

B = 128
E4M3_MAX = 448.0


# ---- DeepSeek's rules, written independently ----
def deepseek_weight_dequant(x: torch.Tensor, s: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """kernel.py weight_dequant: each (possibly partial) tile, in float32, times its scale; stored as ``dtype``
    (DeepSeek stores torch.get_default_dtype(), bf16 in fp8_cast_bf16.py)."""
    m, n = x.shape
    y = torch.empty(m, n, dtype=dtype)
    for i in range(math.ceil(m / B)):
        for j in range(math.ceil(n / B)):
            tile = x[i * B : (i + 1) * B, j * B : (j + 1) * B].to(torch.float32)
            y[i * B : (i + 1) * B, j * B : (j + 1) * B] = (tile * s[i, j].to(torch.float32)).to(dtype)
    return y


def deepseek_scale(group: torch.Tensor, scale_fmt: str) -> torch.Tensor:
    """act_quant: amax = max(max|x|, 1e-4); s = amax / 448 (float32); ue8m0: s = 2**ceil(log2 s)."""
    amax = torch.clamp(group.to(torch.float32).abs().max(), min=1e-4)
    s = amax / E4M3_MAX
    if scale_fmt == "ue8m0":
        s = torch.tensor(2.0 ** math.ceil(math.log2(s.item())), dtype=torch.float32)
    return s


def deepseek_quant(group: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    # y = x / s cast to E4M3; the hardware cast (cvt.rn.satfinite) saturates, so clamp first here
    return (group.to(torch.float32) / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def deepseek_act_quant(x: torch.Tensor, scale_fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    t, k = x.shape
    y = torch.empty(t, k, dtype=torch.float8_e4m3fn)
    s = torch.empty(t, math.ceil(k / B))
    for r in range(t):
        for g in range(math.ceil(k / B)):
            grp = x[r, g * B : (g + 1) * B]  # a partial last group: its amax is the zero-padded group's
            s[r, g] = deepseek_scale(grp, scale_fmt)
            y[r, g * B : (g + 1) * B] = deepseek_quant(grp, s[r, g])
    return y, s


def deepseek_weight_quant(w: torch.Tensor, scale_fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """kernel.py weight_quant's formula per 128x128 tile, with act_quant's 1e-4 amax floor (weight_quant
    itself has none: an all-zero tile there divides 0 by 0)."""
    m, n = w.shape
    y = torch.empty(m, n, dtype=torch.float8_e4m3fn)
    s = torch.empty(math.ceil(m / B), math.ceil(n / B))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * B : (i + 1) * B, j * B : (j + 1) * B]
            s[i, j] = deepseek_scale(tile, scale_fmt)
            y[i * B : (i + 1) * B, j * B : (j + 1) * B] = deepseek_quant(tile, s[i, j])
    return y, s


def random_fp8(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    b = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    b = torch.where((b & 0x7F) == 0x7F, torch.zeros_like(b), b)  # no NaN codes
    return b.view(torch.float8_e4m3fn)


def random_scales(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=gen) + 0.5) * torch.exp2(torch.randint(-20, 5, shape, generator=gen).float())


def weights(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-6, 6, shape, generator=gen).float())


def u8(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


# 576 x 7168 (DeepSeek's kv_a_proj_with_mqa: 4.5 row tiles) and smaller analogues with partial tiles
SHAPES = [(576, 200), (1, 1), (5, 130), (129, 257), (200, 96), (128, 128)]


@pytest.mark.parametrize("shape", SHAPES)
def test_dequant_matches_deepseek_weight_dequant(shape: tuple[int, int], gen: torch.Generator) -> None:
    q = random_fp8(shape, gen)
    s = random_scales((math.ceil(shape[0] / B), math.ceil(shape[1] / B)), gen)
    ours = fp8_block.dequantize_weight(q, s)
    ref = deepseek_weight_dequant(q, s)
    assert torch.equal(ours.view(torch.int32), ref.view(torch.int32)), f"worst |diff| {(ours - ref).abs().max()}"
    assert torch.equal(ours.to(torch.bfloat16), deepseek_weight_dequant(q, s, torch.bfloat16))


def test_dequant_stacked_experts_match_per_expert(gen: torch.Generator) -> None:
    q = random_fp8((3, 130, 200), gen)
    s = random_scales((3, 2, 2), gen)
    ours = fp8_block.dequantize_weight(q, s)
    for e in range(3):
        assert torch.equal(ours[e], deepseek_weight_dequant(q[e], s[e])), f"expert {e}"


@pytest.mark.parametrize("scale_fmt", fp8_block.SCALE_FMTS)
@pytest.mark.parametrize("shape", [(576, 200), (5, 130), (129, 257), (3, 64)])
def test_weight_quant_matches_the_deepseek_formula(shape: tuple[int, int], scale_fmt: str, gen: torch.Generator) -> None:
    w = weights(shape, gen)
    w[: min(shape[0], B), : min(shape[1], B)] = 0  # an all-zero tile gets the 1e-4 floor
    q, s = fp8_block.quantize_weight(w, scale_fmt)
    rq, rs = deepseek_weight_quant(w, scale_fmt)
    assert torch.equal(s, rs)
    assert torch.equal(u8(q), u8(rq)), f"{(u8(q) != u8(rq)).sum()} bytes differ"


@pytest.mark.parametrize("scale_fmt", fp8_block.SCALE_FMTS)
@pytest.mark.parametrize("shape", [(4, 256), (3, 200), (1, 5)])
def test_act_quant_matches_deepseek_act_quant(shape: tuple[int, int], scale_fmt: str, gen: torch.Generator) -> None:
    x = weights(shape, gen)
    x[0] = 0  # a zero token: s = 1e-4 / 448, every byte 0
    q, s = fp8_block.quantize_act(x, scale_fmt)
    rq, rs = deepseek_act_quant(x, scale_fmt)
    assert torch.equal(s, rs)
    assert torch.equal(u8(q), u8(rq))
    d = fp8_block.dequantize_act(q, s)
    ref = torch.cat([rq[:, g * B : (g + 1) * B].float() * rs[:, g : g + 1] for g in range(rs.shape[1])], dim=1)
    assert torch.equal(d, ref)


def test_golden_bytes_float_scales() -> None:
    # amax 448 -> s = 1.0; bytes by hand: 448 0x7E, 1 0x38, -0.5 1.0110.000 = 0xB0, 0 0x00,
    # 2.25 = 1.125*2 -> 0.1000.001 = 0x41, 300 -> 288 (nearer than 320) = 1.125*2**8 -> 0x79
    w = torch.tensor([[448.0, 1.0, -0.5], [0.0, 2.25, 300.0]])
    q, s = fp8_block.quantize_weight(w)
    assert u8(q).tolist() == [[0x7E, 0x38, 0xB0], [0x00, 0x41, 0x79]]
    assert s.tolist() == [[1.0]]
    q2, s2 = fp8_block.quantize_weight(2 * w)  # amax 896 -> s = 2.0 exactly, same bytes
    assert torch.equal(u8(q2), u8(q)) and s2.tolist() == [[2.0]]
    # amax 449 -> s = fl(449 / 448) = 0x3F804925; 449/s ~ 448 -> 0x7E, the rest round as before
    w3 = torch.tensor([[449.0, 1.0, -0.5], [0.0, 2.25, 300.0]])
    q3, s3 = fp8_block.quantize_weight(w3)
    assert s3.view(torch.int32).tolist() == [[0x3F804925]]
    assert u8(q3).tolist() == [[0x7E, 0x38, 0xB0], [0x00, 0x41, 0x79]]
    # an all-zero tile: s = fl(fl(1e-4) / 448) = 0x346FACAD, bytes 0
    qz, sz = fp8_block.quantize_weight(torch.zeros(2, 3))
    assert sz.view(torch.int32).tolist() == [[0x346FACAD]] and u8(qz).tolist() == [[0, 0, 0], [0, 0, 0]]


def test_golden_bytes_ue8m0_scales() -> None:
    # amax 449: s = 2**ceil(log2(449/448)) = 2.  449/2 = 224.5 -> 224 = 1.75*2**7 -> 0.1110.110 = 0x76;
    # 0.5 -> 0x30; -0.25 -> 1.0101.000 = 0xA8; 1.125 -> 0x39; 150 -> 144 (nearer than 160) = 1.125*2**7 -> 0x71
    w = torch.tensor([[449.0, 1.0, -0.5], [0.0, 2.25, 300.0]])
    q, s = fp8_block.quantize_weight(w, "ue8m0")
    assert s.tolist() == [[2.0]]
    assert u8(q).tolist() == [[0x76, 0x30, 0xA8], [0x00, 0x39, 0x71]]
    # floor rule: s = 2**(floor(log2 449) - 8) = 1, and 449 saturates to 448
    q, s = fp8_block.quantize_weight(w, "ue8m0", rule="floor")
    assert s.tolist() == [[1.0]] and u8(q)[0, 0].item() == 0x7E


def test_golden_bytes_partial_row_tile() -> None:
    # [130, 2]: tile 0 = rows 0..127 (amax 448, s 1), tile 1 = rows 128..129 (amax 896, s 2)
    w = torch.ones(130, 2)
    w[0, 0] = 448.0
    w[128] = torch.tensor([-896.0, 2.0])
    w[129] = 0.0
    q, s = fp8_block.quantize_weight(w)
    assert s.tolist() == [[1.0], [2.0]]
    assert u8(q)[0].tolist() == [0x7E, 0x38] and u8(q)[1].tolist() == [0x38, 0x38]
    assert u8(q)[128:].tolist() == [[0xFE, 0x38], [0x00, 0x00]]  # -448 = 1.1111.110, 1.0


def half_ulp(v: torch.Tensor) -> torch.Tensor:
    """Half the E4M3 spacing at |v| (float64): 2**(max(floor(log2|v|), -6) - 4)."""
    e = (torch.frexp(v.abs().double())[1] - 1).clamp(min=-6)
    return torch.ldexp(torch.ones_like(v, dtype=torch.float64), e - 4)


shape_st = st.tuples(st.integers(1, 140), st.integers(1, 140))


@given(shape_st, st.integers(0, 2**31), st.integers(-40, 40))
def test_error_bound_float_scales(shape: tuple[int, int], seed: int, mag: int) -> None:
    w = weights(shape, torch.Generator().manual_seed(seed)) * 2.0**mag
    q, s = fp8_block.quantize_weight(w)
    d = fp8_block.dequantize_weight(q, s).double()
    se = fp8_block.expand_tiles(s, *shape).double()
    v = w / fp8_block.expand_tiles(s, *shape)  # the computed quotient the element rounds from
    # half an ulp of the quotient, plus the two float32 roundings (x / s and q * s)
    bound = half_ulp(v) * se + 2.0**-23 * (w.double().abs() + d.abs())
    err = (d - w.double()).abs()
    assert (err <= bound).all(), f"worst element {divmod(int((err - bound).argmax()), shape[1])}"


@given(shape_st, st.integers(0, 2**31), st.integers(-40, 40))
def test_error_bound_pow2_scales_is_exactly_half_an_ulp(shape: tuple[int, int], seed: int, mag: int) -> None:
    w = weights(shape, torch.Generator().manual_seed(seed)) * 2.0**mag
    q, s = fp8_block.quantize_weight(w, "ue8m0")
    assert fp8_block.is_pow2_scale(s)
    se = fp8_block.expand_tiles(s, *shape).double()
    err = (fp8_block.dequantize_weight(q, s).double() - w.double()).abs()
    assert (err <= half_ulp(w.double() / se) * se).all()  # rceil never saturates


@given(shape_st, st.integers(0, 2**31), st.sampled_from(["float", "ue8m0"]))
def test_no_nan_codes_and_sign_symmetry(shape: tuple[int, int], seed: int, scale_fmt: str) -> None:
    w = weights(shape, torch.Generator().manual_seed(seed))
    q, s = fp8_block.quantize_weight(w, scale_fmt)
    assert not ((u8(q) & 0x7F) == 0x7F).any()
    qn, sn = fp8_block.quantize_weight(-w, scale_fmt)
    assert torch.equal(sn, s) and torch.equal(u8(qn), u8(q) ^ 0x80)


@given(shape_st, st.integers(0, 2**31), st.integers(-30, 30))
def test_idempotent_bytes_float_scales_and_ue8m0_floor(shape: tuple[int, int], seed: int, mag: int) -> None:
    """quantize(dequantize(quantize(w))) == quantize(w), bytes and scales.

    Float scales: the amax element comes back as fl(448 s), and fl(fl(448 s) / 448) == s (checked
    exhaustively below); every other element is within float32 rounding of q * s.  UE8M0 with the
    floor rule: amax / s lies in [256, 512), so the dequantized amax stays in the same binade."""
    w = weights(shape, torch.Generator().manual_seed(seed)) * 2.0**mag
    for fmt, rule in (("float", "rceil"), ("ue8m0", "floor")):
        q, s = fp8_block.quantize_weight(w, fmt, rule)
        q2, s2 = fp8_block.quantize_weight(fp8_block.dequantize_weight(q, s), fmt, rule)
        assert torch.equal(s2, s) and torch.equal(u8(q2), u8(q)), fmt


@pytest.mark.parametrize("e_field", [114, 127, 254])  # amax in [2**-13, 2**-12) (just above the 1e-4 floor), [1, 2), the top binade
def test_float_scale_survives_the_round_trip_for_every_mantissa(e_field: int) -> None:
    # all 2**23 float32 amax of the binade: s = fl(a/448), amax' = fl(s*448), fl(amax'/448) == s.
    # Scaling by a power of two commutes with both roundings, so the binades in between behave alike.
    a = ((e_field << 23) | torch.arange(2**23, dtype=torch.int32)).view(torch.float32)
    s = a / E4M3_MAX
    back = s * E4M3_MAX
    assert torch.isfinite(back).all()
    assert torch.equal(back / E4M3_MAX, s)


@given(shape_st, st.integers(0, 2**31), st.integers(-30, 30))
def test_ue8m0_rceil_is_idempotent_in_values(shape: tuple[int, int], seed: int, mag: int) -> None:
    w = weights(shape, torch.Generator().manual_seed(seed)) * 2.0**mag
    q, s = fp8_block.quantize_weight(w, "ue8m0")
    d = fp8_block.dequantize_weight(q, s)
    q2, s2 = fp8_block.quantize_weight(d, "ue8m0")
    assert torch.equal(fp8_block.dequantize_weight(q2, s2), d)


def test_ue8m0_rceil_bytes_are_not_idempotent() -> None:
    # amax 225 -> s = 2**ceil(log2(225/448)) = 1; 225 rounds to 224 (0x76).  Dequantized amax 224
    # gives s' = 2**ceil(log2(0.5)) = 0.5 and q' = 448 (0x7E): same values, other bytes; stable after that.
    w = torch.tensor([[225.0, 1.0]])
    q, s = fp8_block.quantize_weight(w, "ue8m0")
    assert s.tolist() == [[1.0]] and u8(q).tolist() == [[0x76, 0x38]]
    q2, s2 = fp8_block.quantize_weight(fp8_block.dequantize_weight(q, s), "ue8m0")
    assert s2.tolist() == [[0.5]] and u8(q2).tolist() == [[0x7E, 0x40]]
    assert torch.equal(fp8_block.dequantize_weight(q2, s2), fp8_block.dequantize_weight(q, s))
    q3, s3 = fp8_block.quantize_weight(fp8_block.dequantize_weight(q2, s2), "ue8m0")
    assert torch.equal(s3, s2) and torch.equal(u8(q3), u8(q2))


def test_tile_helpers(gen: torch.Generator) -> None:
    w = weights((130, 257), gen)
    amax = fp8_block.tile_amax(w)
    assert amax.shape == (2, 3)
    assert amax[1, 2].item() == w[128:, 256:].abs().max().item()
    assert fp8_block.expand_tiles(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 129, 130)[128, 129].item() == 4.0


def test_is_pow2_scale() -> None:
    """Exactly the E8M0 values 2**-127 .. 2**127: what FP8-block -> MXFP8 can carry over losslessly."""
    assert fp8_block.is_pow2_scale(torch.tensor([[1.0, 0.5, 2.0**-22, 2.0**127, 2.0**-126, 2.0**-127]]))
    for bad in (1.5, 0.0, -0.0, -2.0, math.inf, -math.inf, math.nan, 3.0, 2.0**-128, 2.0**-149, 1.0 + 2.0**-23):
        assert not fp8_block.is_pow2_scale(torch.tensor([[1.0, bad]])), bad


def test_rejected_inputs() -> None:
    with pytest.raises(ValueError, match="scale format must be one of"):
        fp8_block.quantize_weight(torch.ones(2, 2), "e8m0")
    with pytest.raises(ValueError, match="scale format must be one of"):
        fp8_block.quantize_act(torch.ones(2, 2), "bf16")
    with pytest.raises(ValueError, match="scale rule must be one of"):
        fp8_block.quantize_weight(torch.ones(2, 2), "ue8m0", rule="nearest")
    with pytest.raises(ValueError, match=r"scale grid \(1, 1\) does not fit a weight of \(129, 4\)"):
        fp8_block.dequantize_weight(torch.zeros(129, 4, dtype=torch.float8_e4m3fn), torch.ones(1, 1))


def test_act_quant_of_no_tokens() -> None:
    """A batch with no tokens ([0, K], e.g. an empty MoE slot list) gives empty outputs, not an error."""
    q, s = fp8_block.quantize_act(torch.zeros(0, 200))
    assert q.shape == (0, 200) and q.dtype == torch.float8_e4m3fn and s.shape == (0, 2) and s.dtype == torch.float32
