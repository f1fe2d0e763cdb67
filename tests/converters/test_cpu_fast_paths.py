"""The converters' CPU fast paths against the references they stand in for, bit for bit.

* ``ops.fp8_block_into`` (quantize a band straight into the output, buffers reused) against
  ``formats.fp8_block.quantize_weight``: codes and scale bits, partial tiles, zeros, -0.0,
  subnormals, values at the tile max, both scale formats and rules; Inf/NaN bands as well.
* torch's float32 -> float8_e4m3fn cast written into an output view (what ``fp8_block_into``
  does) against ``formats.fp8.round_e4m3``, over a strided sweep of all 2**32 float32 patterns
  plus every E4M3 rounding boundary (ties, their neighbours, saturation, NaN of both signs).
* ``formats.lut`` with a Scratch (two-byte E4M3 table, E8M0 table, MXFP4, FP8-block dequantize)
  against torch's cast, ``e8m0.decode``, ``mxfp4.decode`` and ``fp8_block.dequantize_weight``.
* ``Fidelity.add`` (buffers reused, squares in place) against the per-chunk formula it computes.
* A conversion's requantized experts and their fidelity record against the same formulas applied
  to the source by the formats/ references, band by band.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from quantkit.converters.fidelity import Fidelity
from quantkit.converters.ops import fp8_block_into, tile_amax
from quantkit.converters.targets import bands
from quantkit.formats import e8m0, fp8_block, lut, mxfp4
from quantkit.formats.fp8 import round_e4m3
from quantkit.formats.lut import Scratch

from .support import run, tensors

SCALINGS = [("float", "rceil"), ("ue8m0", "rceil"), ("ue8m0", "floor")]
SHAPES = [(256, 320), (130, 200), (128, 128), (1, 7), (100, 129), (384, 64), (3, 300)]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def worst(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two same-shape tensors first differ, for a failure message."""
    diff = (a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).nonzero()
    return "equal" if not len(diff) else f"{len(diff)} bytes differ, first at {diff[0].tolist()}"


def awkward(shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """float32 [N, K]: normal values whose magnitude changes by up to 2**+-20 per 16x16 patch, with
    exact zeros, -0.0, float32 subnormals, an all-zero leading tile, repeated +-maxima and values
    that sit on E4M3 rounding ties once divided by a power-of-two scale."""
    n, k = shape
    x = torch.randn(shape, generator=gen)
    mag = torch.randint(-20, 21, (-(-n // 16), -(-k // 16)), generator=gen).float().exp2()
    x = x * mag.repeat_interleave(16, 0).repeat_interleave(16, 1)[:n, :k]
    pick = torch.rand(shape, generator=gen)
    x = torch.where(pick < 0.05, torch.zeros_like(x), x)
    x = torch.where((pick >= 0.05) & (pick < 0.08), torch.full_like(x, -0.0), x)
    x = torch.where((pick >= 0.08) & (pick < 0.1), torch.randn(shape, generator=gen) * 1e-40, x)  # subnormal
    x = torch.where((pick >= 0.1) & (pick < 0.12), torch.full_like(x, 4.5) * 2.0**-3, x)  # ties for pow2 scales
    x[: min(n, 128), : min(k, 128)][:40, :40] = 0.0
    m = x.abs().amax()
    x[n // 2, 0], x[n - 1, k - 1] = m, -m  # the max repeated, both signs
    return x


def quantize_fast(x: torch.Tensor, scale_fmt: str, rule: str, scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_block_into writing into rows 1.. of a larger output (as a band of a stacked tensor)."""
    n, k = x.shape
    out = torch.full((n + 2, k), 0x55, dtype=torch.uint8).view(torch.float8_e4m3fn)
    s = fp8_block_into(x, out[1 : n + 1], scale_fmt, rule, scratch or Scratch())
    assert bool((out.view(torch.uint8)[[0, -1]] == 0x55).all()), "rows outside the band were written"
    return out[1 : n + 1], s


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_block_into_is_quantize_weight(shape, scaling, gen) -> None:
    x = awkward(shape, gen)
    q, s = quantize_fast(x, *scaling)
    q_ref, s_ref = fp8_block.quantize_weight(x, *scaling)
    assert same_bits(s, s_ref), worst(s, s_ref)
    assert same_bits(q, q_ref), worst(q, q_ref)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_block_into_hands_inf_and_nan_bands_to_the_reference(scaling, gen) -> None:
    x = awkward((200, 300), gen)
    x[3, 5], x[150, 140], x[10, 290] = float("nan"), float("inf"), -float("inf")
    x[140, 7] = -float("nan")
    q, s = quantize_fast(x, *scaling)
    q_ref, s_ref = fp8_block.quantize_weight(x, *scaling)
    assert same_bits(s, s_ref) and same_bits(q, q_ref), worst(q, q_ref)
    assert bool((~s.isfinite()).any()) and bool(s.isfinite().any())  # the case really was mixed


def test_fp8_block_into_reuses_its_buffers_band_after_band(gen) -> None:
    scratch = Scratch()
    x = awkward((700, 200), gen)
    for a, b in [(0, 256), (256, 512), (512, 640), (640, 700), (0, 128)]:  # shrinking, then growing again
        q, s = quantize_fast(x[a:b].contiguous(), "float", "rceil", scratch)
        q_ref, s_ref = fp8_block.quantize_weight(x[a:b])
        assert same_bits(q, q_ref) and same_bits(s, s_ref), (a, b)
    assert scratch.get("f32", (10,), torch.float32).data_ptr() == scratch.get("f32", (256 * 200,), torch.float32).data_ptr()


def test_fp8_block_into_refuses_its_own_buffer_as_input(gen) -> None:
    scratch = Scratch()
    x = scratch.get("f32", (128, 128), torch.float32).copy_(torch.randn(128, 128, generator=gen))
    with pytest.raises(ValueError, match="own f32 buffer"):
        fp8_block_into(x, torch.empty(128, 128, dtype=torch.float8_e4m3fn), "float", "rceil", scratch)


@pytest.mark.parametrize("shape", SHAPES)
def test_tile_amax_is_the_padded_reference(shape, gen) -> None:
    x = awkward(shape, gen)
    assert same_bits(tile_amax(x.abs()), fp8_block.tile_amax(x))
    n, k = shape
    for r in sorted({0, 127, n - 1} & set(range(n))):  # each tile's max on its first/last row and column
        for c in sorted({0, 127, 128, k - 1} & set(range(k))):
            y = x.clone()
            y[r, c] = -1e30
            assert same_bits(tile_amax(y.abs()), fp8_block.tile_amax(y)), (r, c)


def e4m3_boundaries() -> torch.Tensor:
    """Every finite E4M3 value, the midpoints between neighbours (ties), the float32 values next to
    each, saturation edges, Inf and NaNs of both signs, and float32 subnormals: as float32."""
    vals = lut.table("e4m3")[:0x7F].double()  # 0 .. 448, ascending
    mids = (vals[1:] + vals[:-1]) / 2  # exact in float32
    pts = torch.cat([vals, mids, torch.tensor([464.0, 480.0, 500.0, 2.0**-10, 2.0**-11, 1e-40, 1e-45])]).float()
    bits = pts.view(torch.int32)
    near = torch.cat([pts, (bits + 1).view(torch.float32), (bits - 1).clamp(min=0).view(torch.float32)])
    special = torch.tensor([0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32)
    both = torch.cat([near, special])
    return torch.cat([both, -both])


def test_cast_into_an_output_view_is_round_e4m3_for_float32_patterns() -> None:
    """fp8_block_into clamps in place and casts into the output with copy_; the reference rounds
    with round_e4m3 (clamp, then .to(float8_e4m3fn)): the same for every pattern tried."""
    sweep = torch.arange(0, 1 << 32, 4093, dtype=torch.int64).to(torch.int32).view(torch.float32)  # ~1.05M patterns
    v = torch.cat([sweep, e4m3_boundaries()])
    out = torch.full((3, v.numel()), 0x55, dtype=torch.uint8).view(torch.float8_e4m3fn)
    out[1].copy_(v.clone().clamp_(-448.0, 448.0))
    ref = round_e4m3(v)
    assert same_bits(out[1], ref), worst(out[1], ref)
    assert bool((out.view(torch.uint8)[[0, 2]] == 0x55).all())


def test_two_byte_e4m3_table_is_the_cast_for_all_byte_pairs() -> None:
    pairs = torch.arange(65536, dtype=torch.int32).to(torch.uint16).view(torch.uint8).view(torch.float8_e4m3fn)
    scratch = Scratch()
    assert same_bits(lut.e4m3_to_f32(pairs, scratch), pairs.to(torch.float32))
    odd = pairs[:257].reshape(257, 1)  # an odd count: the last byte through the one-byte table
    assert same_bits(lut.e4m3_to_f32(odd, scratch), odd.to(torch.float32))


def test_e8m0_table_is_decode_for_all_256_bytes() -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    assert same_bits(lut.e8m0_to_f32(codes), e8m0.decode(codes))
    assert same_bits(lut.e8m0_to_f32(codes.view(torch.float8_e8m0fnu)), e8m0.decode(codes))


def test_mxfp4_decode_with_scratch_is_decode(gen) -> None:
    scratch = Scratch()
    for rows, groups in [(64, 9), (3, 2), (130, 5)]:
        blocks = torch.randint(0, 256, (rows, groups, 16), dtype=torch.uint8, generator=gen)
        scales = torch.randint(0, 256, (rows, groups), dtype=torch.uint8, generator=gen)  # NaN and 2**-127 included
        assert same_bits(lut.mxfp4_decode(blocks, scales, scratch), mxfp4.decode(blocks, scales)), (rows, groups)


@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_block_dequant_with_scratch_is_dequantize_weight(shape, gen) -> None:
    n, k = shape
    q = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).view(torch.float8_e4m3fn)  # NaN codes too
    s = torch.randn((-(-n // 128), -(-k // 128)), generator=gen).abs()
    specials = torch.tensor([0.0, float("inf"), float("nan"), 1e-42, 2.0**-127])
    s.view(-1)[: specials.numel()] = specials[: s.numel()]
    got = lut.fp8_block_dequant(q, s, scratch=Scratch())
    ref = fp8_block.dequantize_weight(q, s)
    assert same_bits(got, ref), worst(got, ref)


def float_bits(xs: list[float]) -> bytes:
    return np.array(xs, dtype=np.float64).tobytes()


def test_dequantize_a_band_at_an_odd_byte_offset(gen) -> None:
    """Bands of an output with odd N and K start at odd byte offsets; the pair table reads them too."""
    w = torch.randint(0, 256, (3, 129, 131), dtype=torch.uint8, generator=gen).view(torch.float8_e4m3fn)
    s = torch.rand((2, 2), generator=gen) + 0.5
    scratch = Scratch()
    for l in range(3):
        band = w[l, :129]
        got = lut.fp8_block_dequant(band, s, scratch=scratch)
        assert same_bits(got, fp8_block.dequantize_weight(band, s)), (l, band.storage_offset())
    assert w[1].storage_offset() % 2 == 1
    with pytest.raises(ValueError, match="one \\[N, K\\] band"):
        lut.fp8_block_dequant(w[:, :129], s.expand(3, 2, 2), scratch=scratch)


def plain_sumsq(t: torch.Tensor) -> float:
    return float(np.sum(np.square(t.reshape(-1).numpy()), dtype=np.float64))


def plain_figures(ref: torch.Tensor, out: torch.Tensor) -> tuple[int, float, float, float]:
    """One chunk's (exact count, max |d|, sum d**2, sum ref**2) as the formula in fidelity.py's
    docstring, without buffers: NaN == NaN counts equal; float32 squares summed by numpy in float64."""
    eq = (out == ref) | (out.isnan() & ref.isnan())
    d = torch.where(eq, torch.zeros_like(ref), out - ref)
    return int(eq.sum()), float(d.abs().max()), plain_sumsq(d), plain_sumsq(ref)


def test_fidelity_figures_are_the_plain_formula_chunk_by_chunk(gen) -> None:
    fid = Fidelity()
    chunks = []
    for n in (40000, 100000, 30000, 300000):  # the buffer shrinks and grows again; lengths where the
        # float64 sum's order shows in its last bits (numpy's buffered sum vs a sum of a float64 copy)
        ref = torch.randn(n, generator=gen) * 3
        out = torch.where(torch.rand(n, generator=gen) < 0.4, ref, ref + torch.randn(n, generator=gen) * 1e-3)
        chunks.append((ref, out))
    ref, out = chunks[2]  # equal NaNs and Infs: the elementwise branch
    ref[5], out[5], ref[6], out[6], ref[7], out[7] = float("nan"), float("nan"), float("inf"), float("inf"), -float("inf"), -float("inf")
    for ref, out in chunks:
        before = (ref.clone(), out.clone())
        fid.add(ref, out)
        assert same_bits(ref, before[0]) and same_bits(out, before[1]), "inputs were modified"
    want = [plain_figures(r, o) for r, o in chunks]
    assert float_bits(fid.sse) == float_bits([w[2] for w in want])
    assert float_bits(fid.ssr) == float_bits([w[3] for w in want])  # chunk 2's is NaN (NaN in ref)
    assert fid.exact == sum(w[0] for w in want)
    assert fid.numel == sum(r.numel() for r, _ in chunks)
    assert fid.max_abs == max(w[1] for w in want)


def test_requantized_experts_and_their_record_match_references_band_by_band(synth, tmp_path) -> None:
    """The whole CPU path (decode, quantize, dequantize, fidelity in reused buffers) against the
    formats/ references and the plain fidelity formula over the same bands."""
    src = synth("gpt-oss", "tiny-ragged")
    chunk = 128 * 200
    run(src, tmp_path / "o", to="fp8-block", chunk_elements=chunk)
    s, o = tensors(src), tensors(tmp_path / "o")
    rec = json.loads((tmp_path / "o" / "quantkit.json").read_text())["tensors"]
    for p in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        x = mxfp4.decode(s[p + "_blocks"], s[p + "_scales"])  # [E, N, K]
        q, sc = fp8_block.quantize_weight(x)
        assert same_bits(o[p], q) and same_bits(o[p + "_scale_inv"], sc), p
        y = fp8_block.dequantize_weight(q, sc)
        n, k = x.shape[-2:]
        parts = [(x[e, a:b], y[e, a:b]) for e in range(x.shape[0]) for a, b in bands(n, k, chunk)]
        assert len(parts) > 2 * x.shape[0], "more than one band per expert"
        want = [plain_figures(r.contiguous(), g.contiguous()) for r, g in parts]
        fid = Fidelity(numel=x.numel(), exact=sum(w[0] for w in want), max_abs=max(w[1] for w in want),
                       sse=[w[2] for w in want], ssr=[w[3] for w in want])
        assert rec[p] == fid.record("requantize", False), p
