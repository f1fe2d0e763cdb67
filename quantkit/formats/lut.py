"""Table-driven decoders, bit for bit the same functions as the arithmetic references.

A byte has 256 values, so any function of one byte is a 256-entry table.  On a CPU a gather from
that table is several times faster than torch's element casts (FP8 -> float32 is not vectorised)
or than unpacking nibbles:

* :func:`e4m3_to_f32`: float8_e4m3fn bytes -> float32, the table being ``.to(torch.float32)`` of
  all 256 codes (NaN codes included), so it is the cast by construction.
* :func:`mxfp4_decode`: one MXFP4 byte (two E2M1 codes, low nibble first) -> its two float32
  values, stored as one 8-byte table entry, then times the block's E8M0 scale: the same values and
  the same single multiplication as :func:`mxfp4.decode`.
* :func:`mxfp4_to_e4m3`: one MXFP4 byte -> its two E4M3 bytes (a 2-byte entry), as
  :func:`exact.mxfp4_to_mxfp8` encodes them.
* :func:`fp8_block_dequant`, :func:`mxfp8_dequant`: :mod:`fp8_block` / :mod:`mxfp8`'s dequantize
  with the element cast replaced by :func:`e4m3_to_f32`.

Tables are built once per device and cached (an explicit registry, keyed by table and device).
tests/converters/test_lut.py compares every table entry and random tensors with the references.
"""

from __future__ import annotations

import torch

from . import e8m0, fp8_block, mxfp4, mxfp8

_TABLES: dict[tuple[str, str], torch.Tensor] = {}


def _codes() -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8)


def _build(name: str) -> torch.Tensor:
    codes = _codes()
    if name == "e4m3":
        return codes.view(torch.float8_e4m3fn).to(torch.float32)
    pairs = mxfp4.lut()[mxfp4.unpack(codes).long()].reshape(256, 2)  # [byte] -> (low, high) values
    if name == "mxfp4":
        return pairs.contiguous().view(torch.float64).reshape(256)
    if name == "mxfp4_e4m3":
        return pairs.to(torch.float8_e4m3fn).view(torch.uint8).contiguous().view(torch.int16).reshape(256)
    raise KeyError(name)


def table(name: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The cached 256-entry table ``name`` (e4m3, mxfp4, mxfp4_e4m3) on ``device``."""
    key = (name, str(torch.device(device)))
    if key not in _TABLES:
        _TABLES[key] = _build(name).to(device)
    return _TABLES[key]


def _gather(name: str, b: torch.Tensor) -> torch.Tensor:
    idx = b.view(torch.uint8).reshape(-1).to(torch.int32)
    return table(name, b.device).index_select(0, idx)


def e4m3_to_f32(q: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn (or its uint8 bytes) -> float32, same shape; == ``q.to(torch.float32)``."""
    return _gather("e4m3", q).view(q.shape)


def mxfp4_decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """== :func:`mxfp4.decode` (float32): blocks [..., out, G, 16] + scales [..., out, G] -> [..., out, G*32]."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != mxfp4.BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match [..., G, 16] / [..., G]")
    vals = _gather("mxfp4", blocks).view(torch.float32).view(*scales.shape, mxfp4.BLOCK)
    return (vals * e8m0.decode(scales).unsqueeze(-1)).flatten(-2)


def mxfp4_to_e4m3(blocks: torch.Tensor) -> torch.Tensor:
    """MXFP4 blocks [..., out, G, 16] -> E4M3 [..., out, G*32], the elements' exact E4M3 encodings."""
    pairs = _gather("mxfp4_e4m3", blocks).view(torch.uint8)
    return pairs.view(torch.float8_e4m3fn).view(*blocks.shape[:-2], blocks.shape[-2] * mxfp4.BLOCK)


def fp8_block_dequant(q: torch.Tensor, scale_inv: torch.Tensor, block: int = fp8_block.BLOCK) -> torch.Tensor:
    """== :func:`fp8_block.dequantize_weight`."""
    n, k = q.shape[-2:]
    want = (-(-n // block), -(-k // block))
    if tuple(scale_inv.shape[-2:]) != want:
        raise ValueError(f"scale grid {tuple(scale_inv.shape)} does not fit a weight of {tuple(q.shape)} in {block}x{block} tiles")
    return e4m3_to_f32(q) * fp8_block.expand_tiles(scale_inv.to(torch.float32), n, k, block)


def mxfp8_dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """== :func:`mxfp8.dequantize`."""
    k = q.shape[-1]
    if scale.shape[-1] * mxfp8.BLOCK != k or scale.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"MXFP8 scale {tuple(scale.shape)} does not fit elements {tuple(q.shape)} (1x{mxfp8.BLOCK} blocks)")
    return (e4m3_to_f32(q).unflatten(-1, (-1, mxfp8.BLOCK)) * e8m0.decode(scale).unsqueeze(-1)).flatten(-2)
