"""Kernels: the one dispatch point (:mod:`.dispatch`) and the backends registered with it, in subpackages by op.

Each op is defined by its pure-torch reference (``<op>_ref`` beside the op, or :mod:`quantkit.formats` through
:mod:`.quant.quant_ref`); importing a kernel module registers its backend for the ops it implements.

| subpackage      | ops                                                                                   |
|-----------------|---------------------------------------------------------------------------------------|
| :mod:`.gemm`    | gemm_fp8_block, gemm_mxfp8 (Triton tiles, skinny, wgmma; cuBLAS ``scaled_mm``; DeepGEMM) |
| :mod:`.moe`     | fused_moe (decode steps, sorted-token prefill, wgmma), router_topk                      |
| :mod:`.attention` | attention_prefill, attention_decode (Triton; FlashInfer explicit only), rope_rotate, rope_cache_write |
| :mod:`.mla`     | mla_decode (Triton; FlashInfer)                                                         |
| :mod:`.quant`   | mxfp4_decode, fp8_block_quantize_weight, mxfp8_quantize, act_quant_*, rmsnorm/silu_mul/swiglu_act_quant |
| :mod:`.norm`    | add_rmsnorm                                                                             |

Use::

    from quantkit.kernels import dispatch
    q, s = dispatch.call("fp8_block_quantize_weight", w, "ue8m0", backend="auto")
    dispatch.which("fp8_block_quantize_weight", w.device)   # -> "triton" on CUDA, "torch" on CPU

Triton kernels run compiled on CUDA devices.  With ``TRITON_INTERPRET=1`` set before this package is imported
(Triton reads it), they run in Triton's CPU interpreter, but only when a caller asks for ``backend="triton"``
explicitly; ``auto`` never picks the interpreter.
"""

from __future__ import annotations

from importlib import import_module

# the torch references: every op's "torch" backend, registered before any faster one
from . import dispatch
from .attention import attention_ref, rope_ref  # noqa: F401
from .gemm import scaled_mm  # noqa: F401
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
    for _m in ("attention.decode", "attention.prefill", "attention.rope", "gemm.fp8_block", "gemm.mxfp8", "mla.decode", "moe.fused_moe",
               "moe.router", "norm.add_rmsnorm", "quant.fp8_block_quant", "quant.fused_act_quant", "quant.group_quant", "quant.mxfp4_decode"):
        import_module(f"{__name__}.{_m}")

for _m in ("attention.flashinfer", "gemm.deepgemm", "mla.flashinfer"):  # registered where their packages import (DeepGEMM compiles on first use)
    import_module(f"{__name__}.{_m}")
