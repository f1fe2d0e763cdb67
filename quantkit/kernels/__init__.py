"""Kernels: the one dispatch point (:mod:`.dispatch`) and the fast backends registered with it.

Each op is defined by its pure-torch reference in :mod:`quantkit.formats` (:mod:`.reference`
lists them); each kernel module registers its backend for the ops it implements when imported:

| module               | backend  | ops                                                        |
|----------------------|----------|------------------------------------------------------------|
| :mod:`.mxfp4_decode` | triton   | mxfp4_decode                                               |
| :mod:`.fp8_block_quant` | triton | fp8_block_quantize_weight                                 |
| :mod:`.group_quant`  | triton   | mxfp8_quantize, act_quant_mxfp8, act_quant_fp8_block       |
| :mod:`.fused_moe`    | triton   | fused_moe (reference: :mod:`.fused_moe_ref`; prefill on :mod:`.fused_moe_sorted`; shared steps in :mod:`.moe_common`) |
| :mod:`.fused_act_quant` | triton | rmsnorm_act_quant, silu_mul_act_quant, swiglu_act_quant (reference: :mod:`.fused_act_quant_ref`) |
| :mod:`.attention_triton`, :mod:`.attention_triton_decode` | triton | attention_prefill, attention_decode (reference: :mod:`.attention`) |
| :mod:`.attention_flashinfer` | flashinfer (explicit only; when installed) | attention_prefill, attention_decode |
| :mod:`.mla_triton`   | triton   | mla_decode (reference: :mod:`.mla`)                        |
| :mod:`.step_triton`  | triton   | rope_rotate, add_rmsnorm (reference: :mod:`.step_ref`)     |
| :mod:`.mla_flashinfer` | flashinfer (explicit only; when installed) | mla_decode                           |
| :mod:`.deepgemm`     | deepgemm (explicit only; FlashInfer's copy of DeepGEMM, nvcc, sm_90) | gemm_fp8_block |

Use::

    from quantkit.kernels import dispatch
    q, s = dispatch.call("fp8_block_quantize_weight", w, "ue8m0", backend="auto")
    dispatch.which("fp8_block_quantize_weight", w.device)   # -> "triton" on CUDA, "torch" on CPU

Triton kernels run compiled on CUDA devices.  With ``TRITON_INTERPRET=1`` set before this
package is imported (Triton reads it), they run in Triton's CPU interpreter, but only when a
caller asks for ``backend="triton"`` explicitly; ``auto`` never picks the interpreter.
"""

from __future__ import annotations

from . import dispatch, fused_moe_ref, reference, scaled_mm  # noqa: F401  (reference, scaled_mm, fused_moe_ref register the ops)
from . import attention  # noqa: F401  (the attention ops' torch references)
from . import fused_act_quant_ref  # noqa: F401  (the fused norm/activation + act-quant ops' torch references)
from . import mla  # noqa: F401  (the mla_decode op's torch reference)
from . import step_ref  # noqa: F401  (rope_rotate and add_rmsnorm: the torch references)
from .dispatch import BackendUnavailable, Dispatcher, call, which

__all__ = ["dispatch", "call", "which", "Dispatcher", "BackendUnavailable"]

try:
    import triton  # noqa: F401
except ImportError as err:
    dispatch.register_missing("triton", f"triton is not importable ({err})")
else:
    from . import fp8_block_quant, fused_moe, gemm_fp8_block, gemm_mxfp8, group_quant, mxfp4_decode  # noqa: F401  (register "triton")
    from . import attention_triton, attention_triton_decode  # noqa: F401  (register "triton" for the attention ops)
    from . import fused_act_quant  # noqa: F401  (register "triton" for the fused act-quant ops)
    from . import mla_triton  # noqa: F401  (registers "triton" for mla_decode)
    from . import step_triton  # noqa: F401  (registers "triton" for rope_rotate and add_rmsnorm)

from . import attention_flashinfer  # noqa: F401  (registers "flashinfer" when its package is installed)
from . import mla_flashinfer  # noqa: F401  (registers "flashinfer" for mla_decode when installed)
from . import deepgemm  # noqa: F401  (registers "deepgemm" for gemm_fp8_block; compiles on first use where it can)
