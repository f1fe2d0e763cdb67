"""The GEMM ops' torch references, registered as backend ``"torch"``.

| op               | a (tokens)                              | w (weight)                                   |
|------------------|-----------------------------------------|----------------------------------------------|
| ``gemm_fp8_block`` | E4M3 [..., K] + F32 [..., ceil(K/128)] | E4M3 [N, K] + F32 [ceil(N/128), ceil(K/128)] |
| ``gemm_mxfp8``   | E4M3 [..., K] + U8 E8M0 [..., K/32]     | E4M3 [N, K] + U8 E8M0 [N, K/32]              |

Both take ``(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16)`` and return out_dtype [..., N] =
dequant(a) @ dequant(w).T + bias, computed in float32 and rounded once (DeepSeek's numerics).
"""

from __future__ import annotations

import torch

from ...formats import fp8_block, mxfp8
from .. import dispatch


def _finish(y: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype, lead: tuple[int, ...]) -> torch.Tensor:
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype).reshape(*lead, y.shape[-1])


def gemm_fp8_block_ref(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    x = fp8_block.dequantize_act(a, a_scale).reshape(-1, a.shape[-1])
    y = x @ fp8_block.dequantize_weight(w, w_scale).T
    return _finish(y, bias, out_dtype, a.shape[:-1])


def gemm_mxfp8_ref(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    x = mxfp8.dequantize(a, a_scale.view(torch.uint8)).reshape(-1, a.shape[-1])
    y = x @ mxfp8.dequantize(w, w_scale.view(torch.uint8)).T
    return _finish(y, bias, out_dtype, a.shape[:-1])


dispatch.register("gemm_fp8_block", dispatch.REFERENCE, gemm_fp8_block_ref)
dispatch.register("gemm_mxfp8", dispatch.REFERENCE, gemm_mxfp8_ref)
