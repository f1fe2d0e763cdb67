"""DeepSeek MLA decode over the paged latent cache, weight-absorbed: the ``mla_decode`` op's torch reference.

DeepSeek-V3 inference/model.py ``MLA`` (``attn_impl="absorb"``): with q_lat = q_nope W_UK (the caller's), head h
scores key j as (q_lat_h . c_j + q_rot_h . k_rot_j) * scale over the latents c_j and rotated keys k_rot_j all heads
share; o_lat_h = sum_j softmax_j c_j, float32 inside, q's dtype out.  q_lat [B, H, rank], q_rot [B, H, rope]; kv
[slots, rank], k_rot [slots, rope] paged as :mod:`..attention.attention_ref` -> o_lat [B, H, rank].  The new token,
already cached, sees all ``context_lens[b]`` (>= 1) keys.
"""

from __future__ import annotations

import torch

from . import select
from ..attention.attention_ref import paged_rows


def check_mla(q_lat: torch.Tensor, q_rot: torch.Tensor, kv: torch.Tensor, k_rot: torch.Tensor,
              block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
    """The shape rules every backend shares."""
    if q_lat.dim() != 3 or q_rot.dim() != 3 or kv.dim() != 2 or k_rot.dim() != 2:
        raise ValueError(f"mla_decode wants q_lat [B, H, rank], q_rot [B, H, rope], kv [slots, rank], k_rot [slots, rope]; got "
                         f"{tuple(q_lat.shape)}, {tuple(q_rot.shape)}, {tuple(kv.shape)}, {tuple(k_rot.shape)}")
    if q_lat.shape[:2] != q_rot.shape[:2] or q_lat.shape[2] != kv.shape[1] or q_rot.shape[2] != k_rot.shape[1] or kv.shape[0] != k_rot.shape[0]:
        raise ValueError(f"mla_decode shapes do not fit: q_lat {tuple(q_lat.shape)}, q_rot {tuple(q_rot.shape)}, "
                         f"kv {tuple(kv.shape)}, k_rot {tuple(k_rot.shape)}")
    b = q_lat.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != b or tuple(context_lens.shape) != (b,):
        raise ValueError(f"mla_decode: {b} queries, block_tables {tuple(block_tables.shape)}, context_lens {tuple(context_lens.shape)}")


def mla_decode(
    q_lat: torch.Tensor,
    q_rot: torch.Tensor,
    kv: torch.Tensor,
    k_rot: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    *,
    step: object | None = None,
    state: dict | None = None,
) -> torch.Tensor:
    """-> o_lat [B, H, rank].  ``step`` and ``state`` serve backends that plan once per step."""
    check_mla(q_lat, q_rot, kv, k_rot, block_tables, context_lens)
    lens = context_lens.tolist()
    if min(lens, default=1) < 1:
        raise ValueError(f"mla_decode: every context needs >= 1 key (the new token's), got context_lens {lens}")
    out = torch.empty_like(q_lat)  # [B, H, rank]
    for b, n in enumerate(lens):
        rows = paged_rows(block_tables, b, n, block_size)
        c = kv[rows].to(torch.float32)  # [n, rank]
        s = q_lat[b].to(torch.float32) @ c.T + q_rot[b].to(torch.float32) @ k_rot[rows].to(torch.float32).T  # [H, n]
        p = torch.softmax(s * scale, dim=-1)
        out[b] = (p @ c).to(q_lat.dtype)
    return out


select.register("torch", mla_decode)
