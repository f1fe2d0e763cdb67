"""The GEMM ops' torch references, registered as backend ``"torch"``: one per format whose GEMM quantizes its
activations (:attr:`quantkit.formats.Format.gemm_op`, computed by :meth:`~quantkit.formats.Format.gemm_ref`).

| op               | a (tokens)                              | w (weight)                                   |
|------------------|-----------------------------------------|----------------------------------------------|
| ``gemm_fp8_block`` | E4M3 [..., K] + F32 [..., ceil(K/128)] | E4M3 [N, K] + F32 [ceil(N/128), ceil(K/128)] |
| ``gemm_mxfp8``   | E4M3 [..., K] + U8 E8M0 [..., K/32]     | E4M3 [N, K] + U8 E8M0 [N, K/32]              |

Each takes ``(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16)`` and returns out_dtype [..., N] =
dequant(a) @ dequant(w).T + bias, computed in float32 and rounded once (DeepSeek's numerics).
"""

from __future__ import annotations

from ... import formats
from .. import dispatch

gemm_fp8_block_ref = formats.get("fp8-block").gemm_ref
gemm_mxfp8_ref = formats.get("mxfp8").gemm_ref


def _register() -> None:
    for f in formats.FORMATS.values():
        if f.gemm_op is not None:
            dispatch.register(f.gemm_op, dispatch.REFERENCE, f.gemm_ref)


_register()
