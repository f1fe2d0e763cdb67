"""formats.lut's table-driven decoders against the arithmetic references (torch's FP8 cast,
formats.mxfp4 / fp8_block / mxfp8 / exact), bit for bit: every byte value, then random tensors."""

from __future__ import annotations

import torch

from quantkit.formats import exact, fp8_block, lut, mxfp4, mxfp8


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def all_codes() -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_e4m3_table_is_the_cast_for_all_256_codes() -> None:
    q = all_codes().view(torch.float8_e4m3fn)
    got, want = lut.e4m3_to_f32(q), q.to(torch.float32)
    assert same_bits(got, want)  # NaN codes 0x7F / 0xFF included: compared as bits
    assert int(torch.isnan(got).sum()) == 2


def test_mxfp4_tables_for_all_256_bytes_and_all_scales() -> None:
    blocks = all_codes().reshape(16, 16).repeat(256, 1).reshape(256, 16, 16)  # every byte in every row
    scales = all_codes().reshape(256, 1).repeat(1, 16)  # every E8M0 byte, NaN and 2**-127 included
    assert same_bits(lut.mxfp4_decode(blocks, scales), mxfp4.decode(blocks, scales))
    q, e = exact.mxfp4_to_mxfp8(blocks, scales)
    assert same_bits(lut.mxfp4_to_e4m3(blocks), q)


def test_dequantizers_equal_the_references_on_random_tensors() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 200, 320, generator=g) * torch.logspace(-6, 3, 320)
    q, s = fp8_block.quantize_weight(w)
    assert same_bits(lut.fp8_block_dequant(q, s), fp8_block.dequantize_weight(q, s))
    qm, sm = mxfp8.quantize(w)
    assert same_bits(lut.mxfp8_dequant(qm, sm), mxfp8.dequantize(qm, sm))
    cols = q[:, :, 128:256]  # a non-contiguous view, as a column band
    assert same_bits(lut.e4m3_to_f32(cols), cols.to(torch.float32))
    b = torch.randint(0, 256, (2, 7, 10, 16), dtype=torch.uint8, generator=g)
    sc = torch.randint(100, 140, (2, 7, 10), dtype=torch.uint8, generator=g)
    assert same_bits(lut.mxfp4_decode(b, sc), mxfp4.decode(b, sc))
    assert same_bits(lut.mxfp4_decode(b[:, :, 2:5], sc[:, :, 2:5]), mxfp4.decode(b[:, :, 2:5], sc[:, :, 2:5]))
