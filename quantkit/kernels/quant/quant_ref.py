"""The ops of the dispatcher, each defined by its pure-torch reference in :mod:`quantkit.formats`.

Every faster backend of an op takes the same arguments and returns the same tensors:

| op                          | reference                          | returns                                              |
|-----------------------------|------------------------------------|------------------------------------------------------|
| ``mxfp4_decode``            | :func:`formats.mxfp4.decode`       | GPT-OSS blocks/scales -> [..., out, in] dtype        |
| ``fp8_block_quantize_weight``| :func:`formats.fp8_block.quantize_weight` | (E4M3 [..., N, K], F32 [..., N/128, K/128]) |
| ``fp8_block_dequant``       | :func:`formats.fp8_block.dequantize_weight` | F32 [..., N, K]                             |
| ``mxfp8_quantize``          | :func:`formats.mxfp8.quantize`     | (E4M3 [..., K], U8 E8M0 [..., K/32])                 |
| ``mxfp8_dequant``           | :func:`formats.mxfp8.dequantize`   | F32 [..., K]                                         |
| ``act_quant_fp8_block``     | :func:`formats.fp8_block.quantize_act` | (E4M3 [..., K], F32 [..., K/128]), DeepSeek act_quant |
| ``act_quant_mxfp8``         | :func:`formats.mxfp8.quantize`     | (E4M3 [..., K], U8 E8M0 [..., K/32]), 1x32 along K   |

``act_quant_mxfp8`` and ``mxfp8_quantize`` compute the same function; they are separate ops
because activations (few rows, latency-bound) and weights (large, bandwidth-bound) want
different backends.
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
