"""The Triton leaves of ``gemm_fp8_block``: y = dequant(A) @ dequant(W).T (+ bias), float32 accumulation.

Layouts (:mod:`quantkit.formats`, no repacking; DeepSeek-V3 inference/kernel.py ``fp8_gemm``): A E4M3 [..., K] with F32
scales [..., ceil(K/128)] (1x128), W E4M3 [N, K] with F32 ``scale_inv`` [ceil(N/128), ceil(K/128)] (128x128 tiles,
partial edge tiles allowed).  :mod:`.select` chooses the kernel and its config; this module launches it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .block_scaled import BLOCK_K, Config, Side, Workspace, block_scaled_mm
from .skinny import SkinnyConfig, skinny_mm
from .wgmma import WgmmaConfig, wgmma_mm

KernelConfig = Config | SkinnyConfig | WgmmaConfig


def run(a: Side, w: Side, bias: torch.Tensor | None, out_dtype: torch.dtype, cfg: KernelConfig, workspace: Workspace | None = None,
        checked: bool = False) -> torch.Tensor:  # fmt: skip
    """Launch the kernel ``cfg`` names on 2-D operands (``checked``: the selection has applied wgmma's rules)."""
    if isinstance(cfg, SkinnyConfig):
        return skinny_mm(a, w, bias, out_dtype, cfg, workspace)
    if isinstance(cfg, WgmmaConfig):
        return wgmma_mm(a, w, bias, out_dtype, cfg, checked, workspace)
    return block_scaled_mm(a, w, bias, out_dtype, cfg, workspace)


def flatten_act(a: torch.Tensor, a_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] activations and [..., G] scales -> 2-D views [M, K], [M, G]."""
    assert a.shape[:-1] == a_scale.shape[:-1], f"activation {tuple(a.shape)} and its scales {tuple(a_scale.shape)} disagree"
    if a.dim() == 2:
        return a, a_scale
    return a.reshape(-1, a.shape[-1]), a_scale.reshape(-1, a_scale.shape[-1])


def matmul(a: torch.Tensor, a_scale: torch.Tensor, a_side: Callable[[torch.Tensor, torch.Tensor], Side], w: Side, bias: torch.Tensor | None,
           out_dtype: torch.dtype, config: KernelConfig, workspace: Workspace | None, checked: bool) -> torch.Tensor:  # fmt: skip
    """[..., K] activations (their operand built by ``a_side`` from the 2-D views) x the weight -> out_dtype [..., N]."""
    a2, s2 = flatten_act(a, a_scale)
    out = run(a_side(a2, s2), w, bias, out_dtype, config, workspace, checked)
    return out if a.dim() == 2 else out.reshape(*a.shape[:-1], w.q.shape[0])


def act_side(q: torch.Tensor, s: torch.Tensor) -> Side:
    return Side(q, s.to(torch.float32), 1, BLOCK_K)


def gemm_fp8_block(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: KernelConfig,
    workspace: Workspace | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """A E4M3 [..., K] (F32 [..., ceil(K/128)]) x W E4M3 [N, K] (F32 [ceil(N/128), ceil(K/128)]) -> out_dtype [..., N]."""
    sw = Side(w, w_scale.to(torch.float32), BLOCK_K, BLOCK_K)
    return matmul(a, a_scale, act_side, sw, bias, out_dtype, config, workspace, checked)
