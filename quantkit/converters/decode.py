"""Reading one item's source in chunks, in its logical orientation [*lead, N(out), K(in)].

``rows(l, a, b)`` is logical[l][a:b, :] and ``cols(l, a, b)`` logical[l][:, a:b], as float32 on the
compute device; ``raw_rows`` gives the encoded chunk for exact paths.  Row and column bands start
at multiples of 128, so FP8 tiles and MX blocks are never cut (the last band may be partial).
With a :class:`~quantkit.formats.lut.Scratch` (CPU), decoded ``rows`` of encoded sources land in
buffers that the next call overwrites: use each chunk before asking for the next.
"""

from __future__ import annotations

import torch

from ..formats import e8m0
from ..formats.lut import Scratch
from .items import MX, TILE, Item, cdiv
from .ops import Ops
from .source import Reader


def lead(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape[:-2]:
        n *= s
    return n


def scale_f32(s: torch.Tensor) -> torch.Tensor:
    """Block scales as float32: E8M0 bytes decoded, BF16/F16 widened (exact), F32 as is."""
    if s.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return e8m0.decode(s)
    return s.to(torch.float32)


class Decoder:
    def __init__(self, reader: Reader, item: Item, ops: Ops, scratch: Scratch | None = None) -> None:
        src = item.source
        self.scratch = scratch
        self.kind = src.kind
        self.transposed = src.transposed
        self.ops = ops
        self.device = ops.device
        L, (n, k) = lead(item.shape), item.shape[-2:]
        t = [reader.view(name) for name in src.tensors]
        if src.rows is not None:
            t[0] = t[0][src.rows[0] : src.rows[1]]
        if self.kind == "plain":
            self.t = t[0].reshape(L, k, n) if src.transposed else t[0].reshape(L, n, k)
        elif self.kind == "fp8-block":
            self.q, self.s = t[0].reshape(L, n, k), t[1].reshape(L, cdiv(n, TILE), cdiv(k, TILE))
        elif self.kind == "fp8-channel":  # one scale per row [N, 1], or per tensor [1]: one per row here
            self.q, self.s = t[0].reshape(L, n, k), t[1].reshape(-1, 1).expand(n, 1).reshape(L, n, 1)
        elif self.kind == "mxfp8":
            self.q, self.s = t[0].reshape(L, n, k), t[1].reshape(L, n, k // MX)
        else:  # mxfp4: GPT-OSS blocks, or compressed-tensors weight_packed [N, K/2] (the same bytes)
            self.blocks, self.scales = t[0].reshape(L, n, k // MX, MX // 2), t[1].reshape(L, n, k // MX)

    def _to(self, x: torch.Tensor) -> torch.Tensor:
        """On the compute device and contiguous (the Triton launchers assert it)."""
        return x.to(self.device).contiguous()

    def rows(self, l: int, a: int, b: int) -> torch.Tensor:
        if self.kind == "plain":
            x = self.t[l, :, a:b].T if self.transposed else self.t[l, a:b]
            if self.scratch is not None and (x.dtype != torch.float32 or not x.is_contiguous()):
                return self.scratch.get("f32", x.shape, torch.float32).copy_(x)  # widened (exact) into the buffer
            return self._to(x).to(torch.float32).contiguous()
        if self.kind == "fp8-block":
            return self.ops.fp8_dequant(*self.raw_rows(l, a, b), scratch=self.scratch)
        if self.kind == "fp8-channel":
            return self._to(self.q[l, a:b]).to(torch.float32) * scale_f32(self._to(self.s[l, a:b]))
        if self.kind == "mxfp8":
            return self.ops.mxfp8_dequant(*self.raw_rows(l, a, b))
        return self.ops.mxfp4_decode(*self.raw_rows(l, a, b), scratch=self.scratch)

    def cols(self, l: int, a: int, b: int) -> torch.Tensor:
        if self.kind == "plain":
            x = self.t[l, a:b].T if self.transposed else self.t[l, :, a:b]
            return self._to(x).to(torch.float32).contiguous()
        if self.kind == "fp8-block":
            q = self._to(self.q[l, :, a:b])
            return self.ops.fp8_dequant(q, scale_f32(self._to(self.s[l, :, a // TILE : cdiv(b, TILE)])))
        if self.kind == "fp8-channel":
            return self._to(self.q[l, :, a:b]).to(torch.float32) * scale_f32(self._to(self.s[l]))
        g0, g1 = a // MX, cdiv(b, MX)
        if self.kind == "mxfp8":
            return self.ops.mxfp8_dequant(self._to(self.q[l, :, a:b]), self._to(self.s[l, :, g0:g1]).view(torch.uint8))
        return self.ops.mxfp4_decode(self._to(self.blocks[l, :, g0:g1]), self._to(self.scales[l, :, g0:g1]))

    def raw_rows(self, l: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoded rows: (F8 [r, K], F32 tile scales), (F8 [r, K], U8 E8M0 [r, G]) or (MXFP4 blocks [r, G, 16], scales [r, G])."""
        if self.kind == "fp8-block":
            return self._to(self.q[l, a:b]), scale_f32(self._to(self.s[l, a // TILE : cdiv(b, TILE)]))
        if self.kind == "mxfp8":
            return self._to(self.q[l, a:b]), self._to(self.s[l, a:b]).view(torch.uint8)
        if self.kind == "mxfp4":
            return self._to(self.blocks[l, a:b]), self._to(self.scales[l, a:b])
        raise ValueError(f"no encoded rows for a {self.kind} source")

    def all_scales(self) -> torch.Tensor:
        """Every FP8 tile scale of the item as float32 (small: 1/16384 of the weight)."""
        return scale_f32(self.s)
