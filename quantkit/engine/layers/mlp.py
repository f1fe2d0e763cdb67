"""Dense SwiGLU MLP (Qwen3, DeepSeek's dense layers and shared experts): down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
from torch import nn

from ..qlinear import Linear


class MLP(nn.Module):
    def __init__(self, gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
