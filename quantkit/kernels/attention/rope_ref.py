"""RoPE ops of an attention layer, their torch references (Triton: :mod:`.rope`).

``rope_rotate`` (:class:`quantkit.engine.layers.rope.Rope`): x [T, H, D], cos, sin [T, D/2] in x's dtype; with x1, x2
the halves ("half") or even and odd elements ("interleaved"), out = [x1 cos - x2 sin | x2 cos + x1 sin], each op in
x's dtype.  ``rope_cache_write``: q, k rotated so, k and v stored at the caches' rows ``slots``; returns q rotated.
"""

from __future__ import annotations

import torch

from .. import dispatch

STYLES = ("half", "interleaved")  # quantkit.engine.layers.rope.STYLES
DTYPES = (torch.bfloat16, torch.float32)


def check_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"rope style must be one of {STYLES}, not {style!r}")
    if x.dim() != 3 or x.shape[-1] % 2 or x.dtype not in DTYPES:
        raise ValueError(f"rope_rotate takes x [T, H, D] with D even in {DTYPES}, got {x.dtype}{tuple(x.shape)}")
    want = (x.shape[0], x.shape[2] // 2)
    if cos.shape != want or sin.shape != want or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError(f"rope_rotate: cos and sin must be {x.dtype}{want}, got {cos.dtype}{tuple(cos.shape)}, {sin.dtype}{tuple(sin.shape)}")


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "half") -> torch.Tensor:
    """x [T, H, D] rotated by the per-token table cos, sin [T, D/2]."""
    check_rope(x, cos, sin, style)
    d = x.shape[-1]
    c, s = cos[:, None], sin[:, None]
    x1, x2 = (x[..., : d // 2], x[..., d // 2 :]) if style == "half" else (x[..., 0::2], x[..., 1::2])
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def check_rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k.dim() != 3 or v.shape != k.shape or q.dim() != 3 or q.shape[::2] != k.shape[::2] or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"rope_cache_write takes q [T, Hq, D], k and v [T, Hkv, D] of one dtype, got {q.dtype}{tuple(q.shape)}, "
                         f"{k.dtype}{tuple(k.shape)}, {v.dtype}{tuple(v.shape)}")  # fmt: skip
    if k_cache.shape[1:] != k.shape[1:] or v_cache.shape[1:] != v.shape[1:] or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"rope_cache_write: caches must be contiguous [S, {k.shape[1]}, {k.shape[2]}], got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if slots.shape != (q.shape[0],) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"rope_cache_write: slots must be int32/int64 [{q.shape[0]}], got {slots.dtype}{tuple(slots.shape)}")


def rope_cache_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str,
                     slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """q rotated; k rotated and v stored at the caches' rows ``slots``."""
    check_rope_cache(q, k, v, slots, k_cache, v_cache)
    q_rot = rope_rotate(q, cos, sin, style)
    k_cache[slots] = rope_rotate(k, cos, sin, style).to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)
    return q_rot


OPS = {"rope_rotate": rope_rotate, "rope_cache_write": rope_cache_write}
for _op, _fn in OPS.items():
    dispatch.register(_op, dispatch.REFERENCE, _fn)
