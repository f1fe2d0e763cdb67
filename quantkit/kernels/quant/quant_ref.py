"""The format ops, each defined by its reference in :mod:`quantkit.formats` (:data:`OPS`: every registered format's
``references``).  ``act_quant_mxfp8`` and ``mxfp8_quantize`` are one function as two ops: activations (few rows) and
weights (large) may want different backends.  A format registered after this module loaded gets its references
registered on first use (:meth:`quantkit.kernels.dispatch.Registry.table`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import formats
from .. import dispatch

OPS: dict[str, Callable[..., Any]] = {op: fn for f in formats.FORMATS.values() for op, fn in f.references.items()}


def _register() -> None:
    for op, fn in OPS.items():
        dispatch.register(op, dispatch.REFERENCE, fn)


_register()
