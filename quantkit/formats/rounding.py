"""Rounding modes shared by every quantizer: ``nearest`` (ties to even) and ``stochastic``.

Stochastic rounding is counter-based so that it is reproducible whatever the chunking, the
worker count or the device: the uniform number of element ``i`` of output tensor ``name`` is a
pure function of ``(seed, name, i)``, where ``i`` is the element's flat row-major index in the
*whole* output tensor (a chunk passes its first index as ``offset``).

Hash (the spec every kernel reproduces bit for bit):
    k0, k1 = the first two little-endian uint32 words of sha256(f"{seed}:{name}")
    lo, hi = i & 0xFFFFFFFF, i >> 32
    c = mix32(hi ^ k1)                         # one value per 2**32 elements: kernels hoist it
    h = mix32(lo * (k0 | 1) + c)
    u = (h >> 12) * 2**-20                     # float32 in [0, 1), 20 random bits
with mix32 = "lowbias32" (x ^= x>>16; x *= 0x7feb352d; x ^= x>>15; x *= 0x846ca68b; x ^= x>>16),
all arithmetic mod 2**32.  Within a run of 2**32 elements, lo -> lo * (k0 | 1) + c is a bijection
(odd multiplier), so distinct elements hash distinct words, and the key enters both by multiply and
add, so two seeds' streams are not shifts of one another.  One mixing round per element is what
keeps the GPU kernels near memory speed.  A value v between neighbours lo < v < hi rounds up iff
u < floor(f * 2**20) * 2**-20 with f = (v - lo) / (hi - lo), so P(up) = f truncated to 20 bits:
exactly f wherever f has at most 20 significant fraction bits (every E4M3 normal from float32 or
bfloat16, every bfloat16 from float32), at most 2**-20 below it elsewhere (E4M3 subnormals).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Literal

import torch

MODES = ("nearest", "stochastic")
# names the counter hash and the uniform's bits (module docstring): recorded with stochastic
# outputs, so a checkpoint says which stream made its bytes and --resume refuses to mix two
HASH_ID = "lowbias32x1-u20"
_M32 = 0xFFFFFFFF
MIX_C1 = 0x7FEB352D
MIX_C2 = 0x846CA68B


@dataclass(frozen=True)
class Rounding:
    """How elements are rounded. ``offset`` is the flat index of this chunk's first element."""

    mode: Literal["nearest", "stochastic"] = "nearest"
    seed: int = 0
    name: str = ""
    offset: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"rounding must be one of {MODES}, not {self.mode!r}")

    @property
    def stochastic(self) -> bool:
        return self.mode == "stochastic"

    def at(self, offset: int) -> "Rounding":
        """The same rounding for a chunk starting ``offset`` elements further on."""
        return replace(self, offset=self.offset + offset)

    def for_tensor(self, name: str) -> "Rounding":
        return replace(self, name=name, offset=0)


NEAREST = Rounding()


def stream_key(seed: int, name: str) -> tuple[int, int]:
    """(k0, k1): the per-(seed, tensor name) key of the counter hash."""
    d = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(d[0:4], "little"), int.from_bytes(d[4:8], "little")


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # x holds uint32 values in int64; split c in 16-bit halves so no product exceeds 2**48.
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on uint32 values carried in an int64 tensor."""
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_C1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_C2)
    return x ^ (x >> 16)


def uniform(r: Rounding, shape: tuple[int, ...] | torch.Size, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 uniforms in [0, 1) for the elements of a chunk of the given shape."""
    k0, k1 = stream_key(r.seed, r.name)
    n = 1
    for s in shape:
        n *= int(s)
    idx = torch.arange(r.offset, r.offset + n, dtype=torch.int64, device=device)
    c = mix32((idx >> 32) ^ k1)
    h = mix32((_mul32(idx & _M32, k0 | 1) + c) & _M32)
    return ((h >> 12).to(torch.float32) * 2.0**-20).reshape(shape)
