"""The numeric ops a conversion calls, on the requested device.

On CPU these are the formats/ reference functions, called directly, except that decoding uses the
table-driven equivalents of :mod:`quantkit.formats.lut` (bit for bit the same function, several
times faster than torch's FP8 cast and nibble unpacking on a CPU).  On CUDA they go through
quantkit.kernels' dispatcher (``backend="auto"``: Triton where a kernel is registered, else the same
torch reference on the GPU); ``backends()`` says which ran, for the report.  Every backend computes
the formats/ function bit for bit, which is what keeps output bytes independent of the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..formats import exact, fp8_block, lut, mxfp8
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
            return REFERENCE[op](*args, **kwargs)
        return self.dispatcher.call(op, *args, **kwargs)

    def backends(self) -> dict[str, str]:
        """op -> backend that ran it ("torch" = the formats/ reference)."""
        return dict(self.dispatcher.ran) if self.dispatcher is not None else {}

    def fp8_block(self, x: torch.Tensor, scale_fmt: str, rule: str, r: Rounding) -> tuple[torch.Tensor, torch.Tensor]:
        """[rows, K] float32 (rows a multiple of 128 but for the last band) -> (E4M3, F32 tile scales)."""
        return self._call("fp8_block_quantize_weight", x, scale_fmt, rule, r)

    def fp8_dequant(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self._call("fp8_block_dequant", q, s)

    def mxfp8(self, x: torch.Tensor, rule: str, r: Rounding) -> tuple[torch.Tensor, torch.Tensor]:
        """[rows, K] float32 -> (E4M3, U8 E8M0 [rows, K/32])."""
        return self._call("mxfp8_quantize", x, rule, r)

    def mxfp8_dequant(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self._call("mxfp8_dequant", q, s)

    def mxfp4_decode(self, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return self._call("mxfp4_decode", blocks, scales)

    def mxfp4_to_mxfp8(self, blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact MXFP4 -> MXFP8 re-encoding (formats.exact); on CPU by a byte table."""
        if self.dispatcher is None:
            return lut.mxfp4_to_e4m3(blocks), scales.view(torch.uint8).clone()
        return exact.mxfp4_to_mxfp8(blocks, scales)
