"""RMSNorm as the families' references compute it.

y = x * rsqrt(mean(x**2) + eps) in float32, then times the weight.  Two orders exist upstream:
``"hf"`` (transformers Llama/Qwen3/DeepseekV3: cast the normalised value back to the input dtype,
then multiply by the weight in that dtype) and ``"f32"`` (transformers GptOss and the gpt-oss
reference: multiply in float32, then cast).  They agree exactly in float32.
"""

from __future__ import annotations

import torch
from torch import nn

ORDERS = ("hf", "f32")


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float, order: str = "hf") -> None:
        super().__init__()
        if order not in ORDERS:
            raise ValueError(f"RMSNorm order must be one of {ORDERS}, not {order!r}")
        self.register_buffer("weight", weight)
        self.eps = float(eps)
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.order == "f32":
            return (self.weight.to(torch.float32) * h).to(dtype)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, order={self.order}"
