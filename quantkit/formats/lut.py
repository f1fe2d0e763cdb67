"""Table-driven decoders, bit for bit the same functions as the arithmetic references.

A byte has 256 values, so any function of one byte is a 256-entry table.  On a CPU a gather from
that table is several times faster than torch's element casts (FP8 -> float32 is not vectorised)
or than unpacking nibbles:

* :func:`e4m3_to_f32`: float8_e4m3fn bytes -> float32, the table being ``.to(torch.float32)`` of
  all 256 codes (NaN codes included), so it is the cast by construction.
* :func:`mxfp4_decode`: one MXFP4 byte (two E2M1 codes, low nibble first) -> its two float32
  values, stored as one 8-byte table entry, then times the block's E8M0 scale: the same values and
  the same single multiplication as :func:`mxfp4.decode`.
* :func:`e8m0_to_f32`: E8M0 scale bytes -> float32, the table being :func:`e8m0.decode` of all 256.
* :func:`mxfp4_to_e4m3`: one MXFP4 byte -> its two E4M3 bytes (a 2-byte entry), as
  :func:`exact.mxfp4_to_mxfp8` encodes them.
* :func:`fp8_block_dequant`, :func:`mxfp8_dequant`: :mod:`fp8_block` / :mod:`mxfp8`'s dequantize
  with the element cast replaced by :func:`e4m3_to_f32`.

Given a :class:`Scratch`, :func:`e4m3_to_f32`, :func:`mxfp4_decode` and :func:`fp8_block_dequant`
write into buffers reused from chunk to chunk (a fresh multi-MiB temporary page-faults on every
chunk, which costs about as much as the arithmetic), and E4M3 decodes two bytes per lookup (a
65536-entry table of float32 pairs, 512 KiB): the same values, about half the gathers.

Tables are built once per device and cached (an explicit registry, keyed by table and device).
tests/formats/test_lut.py compares every table entry and random tensors with the references, and
tests/converters/test_cpu_fast_paths.py the Scratch paths.
"""

from __future__ import annotations

import math

import torch

from . import e8m0, fp8_block, mxfp4, mxfp8

_TABLES: dict[tuple[str, str], torch.Tensor] = {}


def _codes() -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8)


def _build(name: str) -> torch.Tensor:
    codes = _codes()
    if name == "e4m3":
        return codes.view(torch.float8_e4m3fn).to(torch.float32)
    if name == "e8m0":
        return e8m0.decode(codes)
    if name == "e4m3x2":  # uint16 i (bytes lo, hi as stored, little-endian) -> (e4m3(lo), e4m3(hi))
        one = table("e4m3")
        i = torch.arange(65536, dtype=torch.int32)
        return torch.stack([one[i & 0xFF], one[i >> 8]], -1).view(torch.float64).reshape(65536)
    pairs = mxfp4.lut()[mxfp4.unpack(codes).long()].reshape(256, 2)  # [byte] -> (low, high) values
    if name == "mxfp4":
        return pairs.contiguous().view(torch.float64).reshape(256)
    if name == "mxfp4_e4m3":
        return pairs.to(torch.float8_e4m3fn).view(torch.uint8).contiguous().view(torch.int16).reshape(256)
    raise KeyError(name)


class Scratch:
    """Named CPU buffers, handed out again for every chunk of a tensor.

    ``get`` returns a view of the buffer ``name`` (grown when too small), valid until the next
    ``get`` of that name.  The functions here that take a Scratch return their float32 result in
    its buffer ``f32`` (indices go to ``idx``), so a result lasts until the next such call with the
    same Scratch; give each producer whose result must outlive another's its own Scratch."""

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = self._bufs[name] = torch.empty(n, dtype=dtype)  # 1-D, 64-byte aligned
        return buf[:n].view(shape)


def table(name: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The cached table ``name`` (e4m3, e4m3x2, e8m0, mxfp4, mxfp4_e4m3) on ``device``."""
    key = (name, str(torch.device(device)))
    if key not in _TABLES:
        _TABLES[key] = _build(name).to(device)
    return _TABLES[key]


def _gather(name: str, b: torch.Tensor) -> torch.Tensor:
    idx = b.view(torch.uint8).reshape(-1).to(torch.int32)
    return table(name, b.device).index_select(0, idx)


def e4m3_to_f32(q: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
    """float8_e4m3fn (or its uint8 bytes) -> float32, same shape; == ``q.to(torch.float32)``.

    With ``scratch`` (CPU): two bytes per lookup, into its buffer ``f32``."""
    if scratch is None:
        return _gather("e4m3", q).view(q.shape)
    b = q.contiguous().view(torch.uint8).reshape(-1)
    if b.storage_offset() % 2:  # a band of an odd-sized output: pairs need an even byte offset
        b = scratch.get("bytes", b.shape, torch.uint8).copy_(b)
    n, even = b.numel(), b.numel() - b.numel() % 2
    out = scratch.get("f32", (n,), torch.float32)
    idx = scratch.get("idx", (even // 2,), torch.int32)
    idx.copy_(b[:even].view(torch.uint16))  # shape [n/2]: byte pairs as unsigned 16-bit indices
    torch.index_select(table("e4m3x2"), 0, idx, out=out[:even].view(torch.float64))
    if n > even:
        out[even:] = table("e4m3").index_select(0, b[even:].to(torch.int32))
    return out.view(q.shape)


def e8m0_to_f32(b: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (uint8 or float8_e8m0fnu) -> float32, same shape; == :func:`e8m0.decode`."""
    return _gather("e8m0", b).view(b.shape)


def mxfp4_decode(blocks: torch.Tensor, scales: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
    """== :func:`mxfp4.decode` (float32): blocks [..., out, G, 16] + scales [..., out, G] -> [..., out, G*32].

    With ``scratch`` (CPU): into its buffer ``f32``."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != mxfp4.BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match [..., G, 16] / [..., G]")
    if scratch is None:
        vals = _gather("mxfp4", blocks).view(torch.float32).view(*scales.shape, mxfp4.BLOCK)
        return (vals * e8m0_to_f32(scales).unsqueeze(-1)).flatten(-2)
    idx = scratch.get("idx", (blocks.numel(),), torch.int32)
    idx.copy_(blocks.contiguous().view(torch.uint8).reshape(-1))
    vals = scratch.get("f32", (*scales.shape, mxfp4.BLOCK), torch.float32)
    torch.index_select(table("mxfp4"), 0, idx, out=vals.view(-1).view(torch.float64))
    return vals.mul_(e8m0_to_f32(scales).unsqueeze(-1)).flatten(-2)  # the same product as above, in place


def mxfp4_to_e4m3(blocks: torch.Tensor) -> torch.Tensor:
    """MXFP4 blocks [..., out, G, 16] -> E4M3 [..., out, G*32], the elements' exact E4M3 encodings."""
    pairs = _gather("mxfp4_e4m3", blocks).view(torch.uint8)
    return pairs.view(torch.float8_e4m3fn).view(*blocks.shape[:-2], blocks.shape[-2] * mxfp4.BLOCK)


def tile_rows(x: torch.Tensor, block: int = fp8_block.BLOCK) -> list[tuple[torch.Tensor, int]]:
    """[N, K] -> its whole row tiles as one [tn, block, K] view (and tile 0), then the partial last
    row tile as [1, r, K] (and its index): the pieces a per-tile row vector broadcasts over."""
    n, k = x.shape
    whole = n // block * block
    parts = [(x[:whole].view(n // block, block, k), 0)] if whole else []
    return parts + ([(x[whole:].view(1, n - whole, k), n // block)] if whole < n else [])


def tile_row_scales(scale_inv: torch.Tensor, k: int, block: int = fp8_block.BLOCK) -> torch.Tensor:
    """Tile scales [tn, tk] -> [tn, 1, K]: each tile row's scale per column (edge tile cut)."""
    return scale_inv.to(torch.float32).repeat_interleave(block, -1)[:, None, :k]


def fp8_block_dequant(q: torch.Tensor, scale_inv: torch.Tensor, block: int = fp8_block.BLOCK, scratch: Scratch | None = None) -> torch.Tensor:
    """== :func:`fp8_block.dequantize_weight`.

    With ``scratch`` (CPU, q [N, K]): into its buffer ``f32``, each element times its tile's scale
    in place (the same single product per element as the reference)."""
    n, k = q.shape[-2:]
    want = (-(-n // block), -(-k // block))
    if tuple(scale_inv.shape[-2:]) != want:
        raise ValueError(f"scale grid {tuple(scale_inv.shape)} does not fit a weight of {tuple(q.shape)} in {block}x{block} tiles")
    if scratch is None:
        return e4m3_to_f32(q) * fp8_block.expand_tiles(scale_inv.to(torch.float32), n, k, block)
    if q.dim() != 2:
        raise ValueError(f"fp8_block_dequant with a scratch takes one [N, K] band, not {tuple(q.shape)}")
    y, srow = e4m3_to_f32(q, scratch), tile_row_scales(scale_inv, k, block)
    for part, t in tile_rows(y, block):
        part.mul_(srow[t : t + part.shape[0]])
    return y


def mxfp8_dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """== :func:`mxfp8.dequantize`."""
    k = q.shape[-1]
    if scale.shape[-1] * mxfp8.BLOCK != k or scale.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"MXFP8 scale {tuple(scale.shape)} does not fit elements {tuple(q.shape)} (1x{mxfp8.BLOCK} blocks)")
    return (e4m3_to_f32(q).unflatten(-1, (-1, mxfp8.BLOCK)) * e8m0_to_f32(scale).unsqueeze(-1)).flatten(-2)
