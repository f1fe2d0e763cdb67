"""Non-finite values in checkpoint tensors, found without decoding them.

What counts as non-finite, by how a tensor's bytes are read (REFERENCE.md, Numeric formats):
  float   BF16 / F16 / F32 / F64: NaN or +-Inf
  e4m3    F8_E4M3 (float8_e4m3fn): S.1111.111 is NaN (the format has no Inf)
  e5m2    F8_E5M2: exponent 11111 is Inf or NaN
  e8m0    E8M0 scale bytes (F8_E8M0, or U8 scales of MXFP4 / MXFP8 / E8M0 fp8-block): 0xFF is NaN;
          0x00 is 2^-127, a valid scale
MXFP4 code bytes (every E2M1 code is finite) and integer tensors have none.

Why it matters: a quantizer spreads one NaN to its whole block (fp8-block turns 5 NaNs into a
16,384-NaN tile, one Inf into a tile of zeros with scale inf), so a bad value must be named where it
is, before it is converted.  Tensors are scanned in chunks, so memory stays bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CHUNK = 1 << 22  # elements per scanned chunk
FLOATS = ("BF16", "F16", "F32", "F64")
WHAT = {"float": "NaN/Inf values", "e4m3": "E4M3 NaN bytes", "e5m2": "E5M2 Inf/NaN bytes", "e8m0": "E8M0 NaN scale bytes (0xFF)"}


@dataclass(frozen=True)
class NonFinite:
    tensor: str
    code: str
    count: int
    first: tuple[int, ...]  # index of the first one

    def message(self) -> str:
        return f"{self.tensor}: {self.count} {WHAT[self.code]}, the first at {list(self.first)}"


def code_of(dtype: str, e8m0_bytes: bool = False) -> str | None:
    """How a tensor of safetensors ``dtype`` is scanned; ``e8m0_bytes``: a U8 tensor holding E8M0 scales."""
    if dtype in FLOATS:
        return "float"
    return {"F8_E4M3": "e4m3", "F8_E5M2": "e5m2", "F8_E8M0": "e8m0"}.get(dtype, "e8m0" if e8m0_bytes and dtype == "U8" else None)


# SWAR test of 8 E4M3 bytes at once: a byte b has (b & 0x7F) == 0x7F iff (b & 0x7F) + 1 sets bit 7,
# and (b & 0x7F) + 1 <= 0x80 never carries into the next byte
_M7F, _M01, _M80 = 0x7F7F7F7F7F7F7F7F, 0x0101010101010101, 0x8080808080808080 - (1 << 64)


def _maybe_bad(c: torch.Tensor, code: str) -> bool:
    """A fast test that may say True when all is well (then the exact mask decides), never False when not."""
    if code == "float":
        return not bool(torch.isfinite(c.sum()))  # NaN/Inf always propagate; an overflowing sum only costs the exact scan
    if code == "e4m3" and c.numel() % 8 == 0 and c.storage_offset() % 8 == 0:
        v = c.view(torch.uint8).view(torch.int64)
        return bool((((v & _M7F) + _M01) & _M80).any())
    return True


def _bad(c: torch.Tensor, code: str) -> torch.Tensor:
    if code == "float":
        return ~torch.isfinite(c)
    u = c.view(torch.uint8)
    if code == "e4m3":
        return (u & 0x7F) == 0x7F
    if code == "e5m2":
        return (u & 0x7C) == 0x7C
    return u == 0xFF


def scan(name: str, t: torch.Tensor, code: str | None) -> NonFinite | None:
    """The non-finite values of ``t`` (read as ``code``), or None."""
    if code is None or t.numel() == 0:
        return None
    flat = t.reshape(-1)
    count, first = 0, -1
    for a in range(0, flat.numel(), CHUNK):
        c = flat[a : a + CHUNK]
        if not _maybe_bad(c, code):
            continue
        bad = _bad(c, code)
        k = int(bad.sum())
        if k and first < 0:
            first = a + int(bad.to(torch.uint8).argmax())
        count += k
    if not count:
        return None
    return NonFinite(name, code, count, tuple(int(i) for i in torch.unravel_index(torch.tensor(first), t.shape)))
