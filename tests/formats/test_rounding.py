"""Counter-based rounding: the hash against an independent pure-python implementation of the documented
formula, golden values, unbiasedness of stochastic rounding (and that a biased rounding fails the same
check), seed sensitivity, and identical bytes whatever the chunking."""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from quantkit.formats import fp8, fp8_block, mxfp8
from quantkit.formats.rounding import NEAREST, Rounding, stream_key, uniform

M32 = 0xFFFFFFFF


# ---- an independent implementation of the spec in rounding.py's docstring (plain python ints) ----
def lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def key(seed: int, name: str) -> tuple[int, int]:
    d = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(d[0:4], "little"), int.from_bytes(d[4:8], "little")


def hash20(seed: int, name: str, i: int) -> int:
    """The 20 random bits of element i: u = hash20 * 2**-20."""
    k0, k1 = key(seed, name)
    c = lowbias32((i >> 32) ^ k1)
    return lowbias32(((i & M32) * (k0 | 1) + c) & M32) >> 12


def test_lowbias32_by_hand() -> None:
    # x = 1: x ^= x>>16 -> 0x00000001; x *= 0x7feb352d -> 0x7feb352d; x ^= x>>15 -> 0x7febcafb;
    # x *= 0x846ca68b (mod 2**32) -> 0x6889f849; x ^= x>>16 -> 0x688990c0
    assert lowbias32(1) == 0x688990C0
    assert lowbias32(0) == 0


def test_stream_key_golden() -> None:
    # sha256(b"0:") = ba768b33 1fd86cec ...; little-endian words -> 0x338b76ba, 0xec6cd81f
    assert hashlib.sha256(b"0:").hexdigest().startswith("ba768b331fd86cec")
    assert key(0, "") == (0x338B76BA, 0xEC6CD81F)
    assert stream_key(0, "") == (0x338B76BA, 0xEC6CD81F)
    assert stream_key(42, "model.layers.0.mlp.down_proj.weight") == (0x8ADF539D, 0xB4B7E50A)


# (seed, name, element index, 20-bit hash) from the pure-python implementation above, written out
HASH_GOLDEN = [
    (0, "", 0, 645758),
    (0, "", 1, 225002),
    (0, "", 2, 172547),
    (0, "", 2**32 + 5, 817956),  # exercises the high word
    (42, "model.layers.0.mlp.down_proj.weight", 0, 1006632),
    (42, "model.layers.0.mlp.down_proj.weight", 1, 167910),
    (42, "model.layers.0.mlp.down_proj.weight", 2, 938160),
    (42, "model.layers.0.mlp.down_proj.weight", 2**32 + 5, 731623),
]


@pytest.mark.parametrize(("seed", "name", "i", "h20"), HASH_GOLDEN)
def test_uniform_golden(seed: int, name: str, i: int, h20: int) -> None:
    assert hash20(seed, name, i) == h20
    u = uniform(Rounding("stochastic", seed, name).at(i), (1,))
    assert u.dtype == torch.float32 and u.item() == h20 * 2.0**-20


@given(st.integers(0, 2**40), st.text(max_size=20), st.integers(0, 2**40), st.integers(1, 40))
def test_uniform_matches_the_python_spec(seed: int, name: str, offset: int, n: int) -> None:
    u = uniform(Rounding("stochastic", seed, name, offset), (n,))
    assert [round(x * 2**20) for x in u.tolist()] == [hash20(seed, name, offset + j) for j in range(n)]


@given(st.lists(st.integers(1, 50), min_size=1, max_size=6))
def test_uniform_chunks_concatenate(sizes: list[int]) -> None:
    r = Rounding("stochastic", 7, "t")
    whole = uniform(r, (sum(sizes),))
    parts, start = [], 0
    for s in sizes:
        parts.append(uniform(r.at(start), (s,)))
        start += s
    assert torch.equal(torch.cat(parts), whole)


def test_uniform_range_and_shape() -> None:
    u = uniform(Rounding("stochastic", 0, "t"), (100, 1000))
    assert u.shape == (100, 1000)
    assert u.min() >= 0 and u.max() < 1
    assert torch.equal(u * 2**20, torch.floor(u * 2**20))  # 20-bit grid
    # mean of 1e5 uniforms: sigma = sqrt(1/12 / 1e5) ~ 9.1e-4; allow 5 sigma
    assert abs(u.double().mean().item() - 0.5) < 5 * 9.2e-4
    # each tenth of [0, 1) gets 1e4 +- 5 sigma (sigma = sqrt(1e5 * 0.1 * 0.9) ~ 95)
    counts = torch.bincount((u * 10).long().flatten(), minlength=10)
    assert ((counts - 10_000).abs() < 5 * 95).all(), counts.tolist()


def test_rounding_value_semantics() -> None:
    r = Rounding("stochastic", 5, "a")
    assert r.at(10).at(5).offset == 15
    assert r.at(10).for_tensor("b") == Rounding("stochastic", 5, "b", 0)
    assert r.stochastic and not NEAREST.stochastic
    with pytest.raises(ValueError, match="rounding must be one of"):
        Rounding("truncate")


# ---- unbiasedness ----
N_SEEDS = 1000
# pairs of neighbouring E4M3 values (normal, subnormal, top binade, negative) and where between them
NEIGHBOURS = [(1.0, 1.125), (2.0**-9, 2 * 2.0**-9), (416.0, 448.0), (-0.25, -0.28125), (13.0, 14.0), (0.0, 2.0**-9)]
FRACTIONS = [0.1, 0.25, 0.3, 0.5, 0.7, 0.9]


def stats_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x between lo and hi at the fractions above: (x float32, lo, hi), float64 copies of the bounds."""
    lo = torch.tensor([a for a, _ in NEIGHBOURS for _ in FRACTIONS], dtype=torch.float64)
    hi = torch.tensor([b for _, b in NEIGHBOURS for _ in FRACTIONS], dtype=torch.float64)
    f = torch.tensor(FRACTIONS * len(NEIGHBOURS), dtype=torch.float64)
    x = (lo + f * (hi - lo)).to(torch.float32)
    return x, lo, hi


def unbiased(samples: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> tuple[bool, str]:
    """samples [S, n] of a rounding of x [n] onto {lo, hi}.  Passes when

    * every element's mean over S samples is within 5 sigma of x, sigma = |hi - lo| sqrt(p(1-p)/S),
      p = (x - lo)/(hi - lo) (a per-element bias of more than ~0.08 ulp fails at S = 1000), and
    * the mean over all elements of (mean - x)/ulp is within 5 sigma of 0 (catches a common bias
      of a few hundredths of an ulp, too small for the per-element test).
    """
    s = samples.double()
    xd = x.double()
    ulp = (hi - lo).abs()
    p = (xd - lo) / (hi - lo)
    sigma = ulp * torch.sqrt(p * (1 - p) / s.shape[0])
    err = s.mean(0) - xd
    z = (err.abs() / sigma).max().item()
    rel = err / ulp
    z_all = rel.mean().abs().item() / (torch.sqrt((p * (1 - p)).mean() / (s.shape[0] * len(p)))).item()
    return z < 5 and z_all < 5, f"worst element z={z:.1f}, pooled z={z_all:.1f}"


def biased_stochastic(x: torch.Tensor, r: Rounding, bias: float) -> torch.Tensor:
    """Stochastic rounding whose threshold is shifted: rounds up iff u + bias < fraction."""
    x = x.to(torch.float32)
    a = x.abs()
    e = (torch.frexp(a)[1] - 1).clamp(min=-6)
    ulp = torch.ldexp(torch.ones_like(a), e - 3)
    fl = torch.floor(a / ulp)
    up = (uniform(r, tuple(x.shape)) + bias) < (a / ulp - fl)
    return torch.copysign((fl + up) * ulp, x)


def test_stochastic_mean_converges_to_the_input() -> None:
    x, lo, hi = stats_inputs()
    samples = torch.stack([fp8.round_e4m3(x, Rounding("stochastic", seed=s, name="w")).float() for s in range(N_SEEDS)])
    ok, msg = unbiased(samples, x, lo, hi)
    assert ok, msg


def test_the_unbiasedness_check_rejects_biased_roundings() -> None:
    x, lo, hi = stats_inputs()
    nearest = fp8.round_e4m3(x).float().expand(N_SEEDS, -1)
    ok, msg = unbiased(nearest, x, lo, hi)
    assert not ok, f"nearest passed the unbiasedness check: {msg}"
    # with no bias the re-implementation is the real stochastic rounding, byte for byte
    r0 = Rounding("stochastic", seed=0, name="w")
    assert torch.equal(biased_stochastic(x, r0, 0.0).to(torch.float8_e4m3fn).view(torch.uint8), fp8.round_e4m3(x, r0).view(torch.uint8))
    for bias in (0.03, -0.03):
        shifted = torch.stack([biased_stochastic(x, Rounding("stochastic", seed=s, name="w"), bias) for s in range(N_SEEDS)])
        # sanity: the biased rounding still only picks the two neighbours
        assert ((shifted == lo.float()) | (shifted == hi.float())).all()
        ok, msg = unbiased(shifted, x, lo, hi)
        assert not ok, f"a rounding biased by {bias} ulp passed: {msg}"


def test_stochastic_mxfp8_dequantizes_to_the_input_on_average() -> None:
    # one block per row [x, 448, 0, ...] * 2**-3: amax 56 fixes the floor scale at 2**(5 - 8)
    x, lo, hi = stats_inputs()
    block = torch.zeros(len(x), 32)
    block[:, 0] = x
    block[:, 1] = 448.0
    scaled = 2.0**-3
    samples = []
    for s in range(N_SEEDS):
        q, sc = mxfp8.quantize(block * scaled, rule="floor", rounding=Rounding("stochastic", seed=s, name="w"))
        samples.append(mxfp8.dequantize(q, sc)[:, 0] / scaled)
    assert (sc == 127 - 3).all()
    ok, msg = unbiased(torch.stack(samples), x, lo, hi)
    assert ok, msg


# ---- seeds and chunking ----
def spread(n: int, gen: torch.Generator) -> torch.Tensor:
    """Values spread over the E4M3 range, almost none of them representable."""
    return torch.randn(n, generator=gen) * torch.exp2(torch.randint(-8, 8, (n,), generator=gen).float())


def test_different_seeds_and_names_differ(gen: torch.Generator) -> None:
    x = spread(4096, gen)
    base = fp8.round_e4m3(x, Rounding("stochastic", seed=0, name="a")).view(torch.uint8)
    same = fp8.round_e4m3(x, Rounding("stochastic", seed=0, name="a")).view(torch.uint8)
    assert torch.equal(base, same)
    for other in (Rounding("stochastic", seed=1, name="a"), Rounding("stochastic", seed=0, name="b")):
        diff = (fp8.round_e4m3(x, other).view(torch.uint8) != base).float().mean().item()
        # each element differs with probability 2p(1-p), about 1/3 for p spread over [0, 1)
        assert 0.2 < diff < 0.5, diff


@given(st.lists(st.integers(1, 300), min_size=1, max_size=5), st.integers(0, 2**32))
def test_round_e4m3_same_bytes_for_any_flat_chunking(sizes: list[int], seed: int) -> None:
    x = spread(sum(sizes), torch.Generator().manual_seed(seed))
    r = Rounding("stochastic", seed=seed, name="layers.0.w")
    whole = fp8.round_e4m3(x, r).view(torch.uint8)
    parts, start = [], 0
    for s in sizes:
        parts.append(fp8.round_e4m3(x[start : start + s], r.at(start)).view(torch.uint8))
        start += s
    assert torch.equal(torch.cat(parts), whole)


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_mxfp8_same_bytes_in_row_chunks(rows: int, gen: torch.Generator) -> None:
    n, k = 10, 96
    x = spread(n * k, gen).view(n, k)
    r = Rounding("stochastic", seed=11, name="mlp.down_proj.weight")
    q, s = mxfp8.quantize(x, rounding=r)
    chunks = [mxfp8.quantize(x[i : i + rows], rounding=r.at(i * k)) for i in range(0, n, rows)]
    assert torch.equal(torch.cat([c[0] for c in chunks]).view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(torch.cat([c[1] for c in chunks]), s)


@pytest.mark.parametrize("scale_fmt", ["float", "ue8m0"])
def test_fp8_block_same_bytes_in_tile_row_chunks(scale_fmt: str, gen: torch.Generator) -> None:
    e, n, k = 2, 300, 136  # partial tiles on both dims
    w = spread(e * n * k, gen).view(e, n, k)
    r = Rounding("stochastic", seed=5, name="experts.w")
    q, s = fp8_block.quantize_weight(w, scale_fmt, rounding=r)
    # per expert, then per 128-row band within it (a band holds whole tiles)
    qs, ss = [], []
    for ei in range(e):
        for r0 in range(0, n, 128):
            qi, si = fp8_block.quantize_weight(w[ei, r0 : r0 + 128], scale_fmt, rounding=r.at((ei * n + r0) * k))
            qs.append(qi)
            ss.append(si)
    assert torch.equal(torch.cat(qs).view(torch.uint8), q.view(torch.uint8).view(e * n, k))
    assert torch.equal(torch.cat(ss), s.view(-1, s.shape[-1]))
