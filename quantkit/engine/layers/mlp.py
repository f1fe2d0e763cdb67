"""Dense SwiGLU MLP (Qwen3, DeepSeek's dense layers and shared experts): down(silu(gate(x)) * up(x)),
gate and up as one GEMM where their weights stack (:class:`.qlinear.RowGroup`).

When the down projection quantizes its input (fp8-block / mxfp8 weights with dynamic activation
quantization) and the activations are bfloat16, silu(g) * u and that quantization run as one op,
``silu_mul_act_quant`` (quantkit/kernels/quant/fused_act_quant_ref.py), whose E4M3 bytes and scales go
straight to the down projection's GEMM: the product is never written out in bf16 and read back.
The op's SiLU uses a specified exp (Cephes expf, so Triton reproduces it bit for bit); rounded to
bfloat16 it equals torch's ``silu`` for every bfloat16 input (tested), so the fused path computes
the same bytes as :meth:`MLP.unfused`.  In float32 the two differ by an ulp at times, so float32
activations keep the unfused formula with torch's ``silu``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..qlinear import Linear, RowGroup
from .norm import RMSNorm, norm_quantized

FUSED_DTYPES = (torch.bfloat16,)  # activation dtypes where silu_mul_act_quant equals the unfused path


class MLP(nn.Module):
    def __init__(self, gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.gate_up = RowGroup((gate_proj, up_proj))  # one GEMM (and one input quantization) where the two stack

    def _fused_act(self, x: torch.Tensor) -> bool:
        """Whether silu(g) * u and down_proj's input quantization run as one op (``silu_mul_act_quant``) for x."""
        return self.down_proj.weight.act is not None and x.dtype in FUSED_DTYPES

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._fused_act(x):
            return self.unfused(x)
        return self._down(*self.gate_up(x))

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        """forward(norm(x)), the norm fused with gate / up's input quantization where they quantize alike
        (:func:`.norm.norm_quantized`, as the attention layers' inputs)."""
        a = norm_quantized(norm, self.gate_up.parts, x) if self._fused_act(x) else None
        if a is None:
            return self(norm(x))
        return self._down(*self.gate_up.quantized(*a, x.dtype))

    def _down(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """down(silu(g) * u) with the product quantized by ``silu_mul_act_quant`` (bf16, quantizing down_proj)."""
        act = self.down_proj.weight.act
        a, s = self.down_proj.weight.ops.call("silu_mul_act_quant", g, u, act.kind, act.scale_fmt, act.rule, **act.layout())
        return self.down_proj.quantized(a, s, g.dtype)

    def unfused(self, x: torch.Tensor) -> torch.Tensor:
        """down(silu(gate(x)) * up(x)) with torch's silu, the activation quantized inside ``down_proj``."""
        g, u = self.gate_up(x)
        return self.down_proj(torch.nn.functional.silu(g) * u)
