"""DeepSeek MLA decode over the paged latent cache (weight-absorbed MLA): the op's pure-torch reference.

Numerics (DeepSeek-V3 inference/model.py ``MLA`` with ``attn_impl="absorb"``): kv_b_proj's weight
[H * (qk_nope + v_head), rank] splits per head into W_UK [H, qk_nope, rank] and W_UV [H, v_head, rank].
Every head attends to the same cached latent c_j [rank] (the kv_a_layernorm output) and shared
rotated key k_rot_j [rope].  With the absorbed query q_lat = einsum("hd,hdc->hc", q_nope, W_UK)
(computed by the caller), head h of a sequence scores key j as

    s_hj = (q_lat_h . c_j + q_rot_h . k_rot_j) * scale        (= q_h . k_hj of the expanded "naive" MLA)

and returns o_lat_h = sum_j softmax_j(s_h)_j c_j [rank]; the caller applies W_UV
(out_h = W_UV[h] o_lat_h) and o_proj.  Scores, softmax and the weighted sum are float32; the
output is cast to q's dtype.  One new token per sequence, already written to the cache, sees all
of its ``context_lens[b]`` keys (no mask: it is the last position).

| op           | queries                                      | cache (engine layout)                                         | out                 |
|--------------|----------------------------------------------|---------------------------------------------------------------|---------------------|
| ``mla_decode`` | ``q_lat`` [B, H, rank], ``q_rot`` [B, H, rope] | ``kv`` [slots, rank], ``k_rot`` [slots, rope], ``block_tables``, ``context_lens`` | ``o_lat`` [B, H, rank], q's dtype |

Layouts are :mod:`.attention`'s (the engine's :mod:`quantkit.engine.kv_cache`): slot s of block b
is row b * block_size + s of ``kv`` / ``k_rot`` (the MLA layer's per-token cache entries "kv" and
"k_rot"), ``block_tables`` int32/int64 [B, max_blocks] (-1 past a sequence's blocks),
``context_lens`` int32 [B], each >= 1.  Backends: this reference ("torch"), Triton
(:mod:`.mla_triton`), FlashInfer's MLA wrapper (:mod:`.mla_flashinfer`, explicit only).
"""

from __future__ import annotations

import torch

from .. import dispatch
from ..attention.attention_ref import paged_rows


def check_mla(q_lat: torch.Tensor, q_rot: torch.Tensor, kv: torch.Tensor, k_rot: torch.Tensor,
              block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
    """The shape rules every backend shares (launchers assert their layouts on top)."""
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
) -> torch.Tensor:
    """One new token per sequence over the paged latent cache -> o_lat [B, H, rank] in q_lat's dtype."""
    check_mla(q_lat, q_rot, kv, k_rot, block_tables, context_lens)
    lens = context_lens.tolist()
    if min(lens, default=1) < 1:
        raise ValueError(f"mla_decode: every context needs >= 1 key (the new token's), got context_lens {lens}")
    out = torch.empty_like(q_lat)  # [B, H, rank]
    for b, n in enumerate(lens):
        rows = paged_rows(block_tables, b, n, block_size)
        c = kv[rows].to(torch.float32)  # [n, rank]: the latents every head shares
        s = q_lat[b].to(torch.float32) @ c.T + q_rot[b].to(torch.float32) @ k_rot[rows].to(torch.float32).T  # [H, n]
        p = torch.softmax(s * scale, dim=-1)
        out[b] = (p @ c).to(q_lat.dtype)
    return out


dispatch.register("mla_decode", dispatch.REFERENCE, mla_decode)
