"""Kernels by op (gemm, moe, attention, mla, quant, norm), each op's torch reference beside it as ``<op>_ref``,
and the one dispatch point (:mod:`.dispatch`); importing a kernel module registers its backend.
``quantkit kernels`` prints which leaf runs for each op and shape, and why.  Triton kernels run compiled on CUDA
devices, or in Triton's interpreter (``TRITON_INTERPRET=1`` before import) when asked for explicitly.
"""

from __future__ import annotations

from importlib import import_module

# the references first: a backend registers under an op that has one
from . import dispatch
from .attention import attention_ref, rope_ref  # noqa: F401
from .gemm import gemm_ref  # noqa: F401
from .mla import mla_ref  # noqa: F401
from .moe import fused_moe_ref, router_ref  # noqa: F401
from .norm import add_rmsnorm_ref  # noqa: F401
from .quant import fused_act_quant_ref, quant_ref  # noqa: F401
from .dispatch import BackendUnavailable, Dispatcher, call, which

__all__ = ["dispatch", "call", "which", "Dispatcher", "BackendUnavailable"]

try:
    import triton  # noqa: F401
except ImportError as err:
    dispatch.register_missing("triton", f"triton is not importable ({err})")
else:  # the "triton" backends
    for _m in ("attention.decode", "attention.prefill", "attention.rope", "gemm.select", "mla.decode", "moe.fused_moe",
               "moe.router", "norm.add_rmsnorm", "quant.fp8_block_quant", "quant.fused_act_quant", "quant.group_quant", "quant.mxfp4_decode"):
        import_module(f"{__name__}.{_m}")

import_module(f"{__name__}.mla.flashinfer")  # registers where FlashInfer imports
