"""The numeric ops a conversion calls, on the requested device.

On CPU these are the formats/ reference functions, called directly, except that decoding uses the
table-driven equivalents of :mod:`quantkit.formats.lut` (bit for bit the same function, several
times faster than torch's FP8 cast and nibble unpacking on a CPU), and that FP8-block quantization
with nearest rounding goes through :func:`fp8_block_into`: the reference's function with buffers
reused across chunks and the codes cast straight into the output.  On CUDA they go through
quantkit.kernels' dispatcher (``backend="auto"``: Triton where a kernel is registered, else the same
torch reference on the GPU); ``backends()`` says which ran, for the report.  Every backend computes
the formats/ function bit for bit, which is what keeps output bytes independent of the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import formats
from ..formats import exact, fp8_block, lut, mxfp8
from ..formats.fp8 import E4M3_MAX
from ..formats.rounding import Rounding
from .options import OptionError

# dispatcher op name -> the CPU path: the formats/ reference, or its table-driven equal (formats.lut)
REFERENCE: dict[str, Callable[..., Any]] = {
    "fp8_block_quantize_weight": fp8_block.quantize_weight,
    "fp8_block_dequant": lut.fp8_block_dequant,
    "mxfp8_quantize": mxfp8.quantize,
    "mxfp8_dequant": lut.mxfp8_dequant,
    "mxfp4_decode": lut.mxfp4_decode,
}


def tile_amax(a: torch.Tensor, block: int = fp8_block.BLOCK) -> torch.Tensor:
    """|x| [N, K] (already absolute) -> float32 [ceil(N/b), ceil(K/b)] tile maxima, partial tiles
    without padding (zeros never change a max of absolute values).  NaN propagates (torch.amax)."""
    n, k = a.shape
    whole = k // block * block
    cols = [a[:, :whole].view(n, whole // block, block).amax(-1)] if whole else []  # [N, K // b]
    if whole < k:
        cols.append(a[:, whole:].amax(-1, keepdim=True))  # [N, 1]: the partial column tile
    m = torch.cat(cols, 1) if len(cols) > 1 else cols[0]
    return torch.cat([part.amax(1) for part, _ in lut.tile_rows(m, block)])


def fp8_block_into(x: torch.Tensor, q_out: torch.Tensor, scale_fmt: str, rule: str, scratch: lut.Scratch) -> torch.Tensor:
    """== ``fp8_block.quantize_weight(x, scale_fmt, rule)`` (nearest rounding) for a CPU band x [N, K]
    float32: the E4M3 codes written into ``q_out`` [N, K], the tile scales returned.

    The same operations per element (|x|, tile max, IEEE quotient x / s, clamp to +-448, torch's
    cast), without padding, expanding or fresh temporaries: |x| and then the quotients go to
    ``scratch``'s buffer ``f32`` (which ``x`` must not be).  A band with an Inf or NaN (a non-finite
    tile max) is quantized by the reference itself, whose NaN payloads this does not reproduce."""
    n, k = x.shape
    a = scratch.get("f32", (n, k), torch.float32)
    if a.data_ptr() == x.data_ptr():
        raise ValueError("fp8_block_into: x is the scratch's own f32 buffer (decode into another Scratch)")
    amax = tile_amax(torch.abs(x, out=a))
    if not bool(torch.isfinite(amax).all()):
        q, s = fp8_block.quantize_weight(x, scale_fmt, rule)
        q_out.copy_(q)
        return s
    s = fp8_block.scale_from_amax(amax, scale_fmt, rule)
    srow = lut.tile_row_scales(s, k)  # [tn, 1, K]
    for (xp, t), (ap, _) in zip(lut.tile_rows(x), lut.tile_rows(a)):
        torch.div(xp, srow[t : t + xp.shape[0]], out=ap)
    q_out.copy_(a.clamp_(-E4M3_MAX, E4M3_MAX))  # torch's float32 -> float8_e4m3fn cast, as round_e4m3
    return s


# formats with CPU fast paths (nearest rounding): quantized straight into the output, dequantized into reused buffers
QUANTIZE_INTO: dict[str, Callable[..., torch.Tensor]] = {"fp8-block": fp8_block_into}
DEQUANT_SCRATCH: dict[str, Callable[..., torch.Tensor]] = {"fp8-block": lut.fp8_block_dequant}


class Ops:
    def __init__(self, device: str) -> None:
        if device == "cuda" and not torch.cuda.is_available():
            raise OptionError("--device cuda: no CUDA device is available")
        self.device = torch.device(device)
        self.dispatcher = None
        if device == "cuda":
            from ..kernels.dispatch import Dispatcher

            self.dispatcher = Dispatcher()

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        if self.dispatcher is None:
            return (REFERENCE.get(op) or formats.reference(op))(*args, **kwargs)
        return self.dispatcher.call(op, *args, **kwargs)

    def quantize(self, fmt: formats.Format, x: torch.Tensor, scale_fmt: str, rule: str, r: Rounding, into: torch.Tensor,
                 scratch: lut.Scratch | None) -> tuple[tuple[torch.Tensor, ...], bool]:  # fmt: skip
        """Rows x [r, K] float32 -> (the format's stored tensors' rows, whether the weight was written into ``into``,
        its output rows): on a CPU with nearest rounding fp8-block's codes are cast straight there (:func:`fp8_block_into`)."""
        if fmt.name in QUANTIZE_INTO and self._cpu_scratch(scratch) and not r.stochastic:
            return (into, QUANTIZE_INTO[fmt.name](x, into, scale_fmt, rule, scratch)), True
        return fmt.quantize(self._call, x, scale_fmt, rule, r), False

    def dequantize(self, fmt: formats.Format, *parts: torch.Tensor, scratch: lut.Scratch | None = None) -> torch.Tensor:
        """:meth:`quantize`'s tensors -> float32 rows; fp8-block's with ``scratch`` (CPU only) into a reused buffer."""
        if fmt.name in DEQUANT_SCRATCH and self._cpu_scratch(scratch):
            return DEQUANT_SCRATCH[fmt.name](*parts, scratch=scratch)
        return fmt.dequantize(self._call, *parts)

    def _cpu_scratch(self, scratch: lut.Scratch | None) -> bool:
        """Whether to use ``scratch`` (CPU buffers); one given for a CUDA device is a caller's bug."""
        if scratch is not None and self.dispatcher is not None:
            raise ValueError("scratch buffers are for the CPU path; this Ops computes on CUDA")
        return scratch is not None

    def backends(self) -> dict[str, str]:
        """op -> backend that ran it ("torch" = the formats/ reference)."""
        return dict(self.dispatcher.ran) if self.dispatcher is not None else {}

    def fp8_block(self, x: torch.Tensor, scale_fmt: str, rule: str, r: Rounding) -> tuple[torch.Tensor, torch.Tensor]:
        """[rows, K] float32 (rows a multiple of 128 but for the last band) -> (E4M3, F32 tile scales)."""
        return self._call("fp8_block_quantize_weight", x, scale_fmt, rule, r)

    def fp8_dequant(self, q: torch.Tensor, s: torch.Tensor, scratch: lut.Scratch | None = None) -> torch.Tensor:
        """With ``scratch`` (CPU only): into a buffer reused by the next call (:class:`lut.Scratch`)."""
        if self._cpu_scratch(scratch):
            return lut.fp8_block_dequant(q, s, scratch=scratch)
        return self._call("fp8_block_dequant", q, s)

    def mxfp8_dequant(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self._call("mxfp8_dequant", q, s)

    def mxfp4_decode(self, blocks: torch.Tensor, scales: torch.Tensor, scratch: lut.Scratch | None = None) -> torch.Tensor:
        """With ``scratch`` (CPU only): into a buffer reused by the next call (:class:`lut.Scratch`)."""
        if self._cpu_scratch(scratch):
            return lut.mxfp4_decode(blocks, scales, scratch)
        return self._call("mxfp4_decode", blocks, scales)

    def mxfp4_to_mxfp8(self, blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact MXFP4 -> MXFP8 re-encoding (formats.exact); on CPU by a byte table."""
        if self.dispatcher is None:
            return lut.mxfp4_to_e4m3(blocks), scales.view(torch.uint8).clone()
        return exact.mxfp4_to_mxfp8(blocks, scales)
