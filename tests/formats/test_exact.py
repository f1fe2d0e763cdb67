"""Exact paths: MXFP4 -> MXFP8 and power-of-two FP8-block -> MXFP8 dequantize to identical values;
anything that would need rounding is refused."""

from __future__ import annotations

import math

import pytest
import torch

from quantkit.formats import exact, fp8_block, mxfp4, mxfp8


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def test_mxfp4_to_mxfp8_every_code_and_every_scale() -> None:
    # 256 rows = every scale byte (0xFF included: NaN stays NaN); each row holds all 256 packed bytes
    # over 16 blocks, so every code meets every scale in both nibble positions
    blocks = torch.arange(256, dtype=torch.uint8).view(1, 16, 16).expand(256, 16, 16).contiguous()
    scales = torch.arange(256, dtype=torch.uint8).view(256, 1).expand(256, 16).contiguous()
    q8, s8 = exact.mxfp4_to_mxfp8(blocks, scales)
    assert q8.dtype == torch.float8_e4m3fn and q8.shape == (256, 512) and torch.equal(s8, scales)
    want = mxfp4.decode(blocks, scales)
    got = mxfp8.dequantize(q8, s8)
    assert torch.equal(bits(got), bits(want)), f"first differing row (scale byte) {int((bits(got) != bits(want)).any(1).nonzero()[0])}"


def test_mxfp4_to_mxfp8_golden_bytes() -> None:
    # byte 0xF7: low nibble 7 = +6 -> E4M3 0.1001.100 = 0x4C; high nibble 0xF = -6 -> 0xCC
    # byte 0x81: low 1 = +0.5 -> 0.0110.000 = 0x30; high 8 = -0 -> 0x80
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, :2] = torch.tensor([0xF7, 0x81], dtype=torch.uint8)
    q8, s8 = exact.mxfp4_to_mxfp8(blocks, torch.tensor([[130]], dtype=torch.uint8))
    assert q8.view(torch.uint8)[0, :4].tolist() == [0x4C, 0xCC, 0x30, 0x80]
    assert (q8.view(torch.uint8)[0, 4:] == 0).all() and s8.tolist() == [[130]]


@pytest.mark.parametrize("shape", [(200, 96), (130, 256), (1, 32), (2, 130, 64)])
def test_pow2_fp8_block_to_mxfp8_is_identical(shape: tuple[int, ...], gen: torch.Generator) -> None:
    w = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-10, 10, shape, generator=gen).float())
    q, s = fp8_block.quantize_weight(w, "ue8m0")
    q8, s8 = exact.fp8_block_pow2_to_mxfp8(q, s)
    assert torch.equal(q8.view(torch.uint8), q.view(torch.uint8))
    assert s8.shape == (*shape[:-1], shape[-1] // 32)
    assert torch.equal(bits(mxfp8.dequantize(q8, s8)), bits(fp8_block.dequantize_weight(q, s)))


def test_pow2_fp8_block_to_mxfp8_golden_scale_bytes() -> None:
    # [130, 256]: tiles (0,0)=2**-3 (0,1)=2**4 (1,0)=2**-127 (1,1)=2**127 -> bytes 124, 131, 0, 254,
    # each repeated over the 4 MX blocks of a 128-wide tile and the rows of its band
    q = torch.ones(130, 256).to(torch.float8_e4m3fn)
    s = torch.tensor([[2.0**-3, 2.0**4], [2.0**-127, 2.0**127]])
    q8, s8 = exact.fp8_block_pow2_to_mxfp8(q, s)
    assert s8[0].tolist() == [124] * 4 + [131] * 4
    assert s8[127].tolist() == [124] * 4 + [131] * 4
    assert s8[128].tolist() == [0] * 4 + [254] * 4 and s8[129].tolist() == s8[128].tolist()
    assert torch.equal(bits(mxfp8.dequantize(q8, s8)), bits(fp8_block.dequantize_weight(q, s)))


@pytest.mark.parametrize("bad", [1.5, 2.0**-128, 0.0, -2.0, math.inf, math.nan, 1.0 + 2.0**-23])
def test_non_pow2_scales_are_refused(bad: float) -> None:
    q = torch.zeros(4, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="not all powers of two"):
        exact.fp8_block_pow2_to_mxfp8(q, torch.tensor([[bad]]))


def test_float_scaled_checkpoint_is_refused(gen: torch.Generator) -> None:
    q, s = fp8_block.quantize_weight(torch.randn(64, 64, generator=gen))  # float scales
    with pytest.raises(ValueError, match="not all powers of two"):
        exact.fp8_block_pow2_to_mxfp8(q, s)


def test_k_not_multiple_of_32_is_refused() -> None:
    with pytest.raises(ValueError, match="K=40 is not a multiple of 32"):
        exact.fp8_block_pow2_to_mxfp8(torch.zeros(4, 40, dtype=torch.float8_e4m3fn), torch.ones(1, 1))


LOSSLESS = [
    (("mxfp4", "mxfp8"), {}, "mxfp4->mxfp8"),
    (("mxfp4", "mxfp8"), {"k": 2880}, "mxfp4->mxfp8"),
    (("mxfp4", "mxfp8"), {"k": 40}, None),
    (("fp8-block", "mxfp8"), {"pow2_scales": True}, "fp8-block(ue8m0)->mxfp8"),
    (("fp8-block", "mxfp8"), {"pow2_scales": True, "k": 100}, None),
    (("fp8-block", "mxfp8"), {}, None),
    (("fp8-block", "fp8-block"), {}, "copy"),
    (("fp8-block", "fp8-block"), {"same_scale_fmt": False}, None),
    (("mxfp8", "mxfp8"), {}, "copy"),
    (("bf16", "bf16"), {}, "copy"),
    (("bf16", "fp8-block"), {}, None),
    (("mxfp8", "mxfp4"), {}, None),
    (("mxfp4", "fp8-block"), {}, None),
]


@pytest.mark.parametrize(("pair", "kw", "want"), LOSSLESS)
def test_lossless_path_table(pair: tuple[str, str], kw: dict, want: str | None) -> None:
    assert exact.lossless_path(*pair, **kw) == want


def test_mxfp8_to_fp8_block_exact_tiles_golden() -> None:
    # two 128x128 tiles of 1.125 (E4M3 0x39); tile 0: every 1x32 scale 2**0; tile 1: one column of
    # blocks at 2**-7, where 1.125 * 2**-7 = 9 * 2**-10 is finer than E4M3's subnormal step 2**-9
    q = torch.full((128, 256), 1.125).to(torch.float8_e4m3fn)
    e = torch.full((128, 8), 127, dtype=torch.uint8)
    e[:, 5] = 120
    out, s, ok = exact.mxfp8_to_fp8_block(q, e)
    assert ok.tolist() == [[True, False]] and s.tolist() == [[1.0, 1.0]]
    assert torch.equal(out[:, :128].view(torch.uint8), torch.full((128, 128), 0x39, dtype=torch.uint8))
    # with the block at 2**-3 instead, 1.125 * 2**-3 is an E4M3 normal: exact
    e[:, 5] = 124
    out, s, ok = exact.mxfp8_to_fp8_block(q, e)
    assert ok.all() and torch.equal(fp8_block.dequantize_weight(out, s), mxfp8.dequantize(q, e))


def test_mxfp8_to_fp8_block_partial_tiles() -> None:
    # 200 x 96: partial tiles both ways; random codes under one scale per tile row are exact
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(200, 96, generator=g) * 20).clamp(-448, 448).to(torch.float8_e4m3fn)
    e = torch.full((200, 3), 130, dtype=torch.uint8)
    out, s, ok = exact.mxfp8_to_fp8_block(q, e)
    assert ok.shape == (2, 1) and ok.all() and s.tolist() == [[8.0], [8.0]]
    assert torch.equal(fp8_block.dequantize_weight(out, s), mxfp8.dequantize(q, e))
