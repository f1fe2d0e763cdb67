"""The format ops, each defined by its reference in :mod:`quantkit.formats` (:data:`OPS`).  ``act_quant_mxfp8`` and
``mxfp8_quantize`` are one function as two ops: activations (few rows) and weights (large) may want different backends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...formats import fp8_block, mxfp4, mxfp8
from .. import dispatch

OPS: dict[str, Callable[..., Any]] = {
    "mxfp4_decode": mxfp4.decode,
    "fp8_block_quantize_weight": fp8_block.quantize_weight,
    "fp8_block_dequant": fp8_block.dequantize_weight,
    "mxfp8_quantize": mxfp8.quantize,
    "mxfp8_dequant": mxfp8.dequantize,
    "act_quant_fp8_block": fp8_block.quantize_act,
    "act_quant_mxfp8": mxfp8.quantize,
}


def _register() -> None:
    for op, fn in OPS.items():
        dispatch.register(op, dispatch.REFERENCE, fn)


_register()
