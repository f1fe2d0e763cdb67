"""Four ops of a decoder layer's small work, each one launch instead of many on a GPU: their arithmetic in
torch, registered as the ``"torch"`` reference (the Triton backends live in :mod:`.step_triton`).

| op            | input                                                        | returns                                   |
|---------------|--------------------------------------------------------------|-------------------------------------------|
| ``rope_rotate`` | x [T, H, D] (unit stride along D), cos, sin [T, D/2] in x's dtype, style | x rotated, [T, H, D] contiguous, x.dtype |
| ``rope_cache_write`` | q [T, Hq, D], k, v [T, Hkv, D] (unit stride along D), cos, sin, style, slots [T], k_cache, v_cache [S, Hkv, D] | q rotated; k rotated and v written to the caches' rows ``slots`` |
| ``add_rmsnorm`` | x, y [..., K] (one dtype), weight [K], eps, order          | (s = x + y in x.dtype, rms_norm(s))       |
| ``router_topk`` | x [T, H], weight [E, H], bias [E] or None, top_k, rule, norm_topk_prob | (weights float32 [T, k], expert ids int64 [T, k]) |

``rope_rotate`` is :class:`quantkit.engine.layers.rope.Rope`'s rotation op for op: with x1, x2 the halves
(style "half") or the even and odd elements ("interleaved"), out = [x1 cos - x2 sin | x2 cos + x1 sin],
each product, difference and sum an operation in x's dtype (a bfloat16 op is the float32 op rounded to
bfloat16).  A kernel that rounds at the same points gives the same bytes.  The table (cos, sin) is made
once per step by the engine (:meth:`.Rope.cos_sin`); the op rotates q and k of every layer with it.

``rope_cache_write`` is an attention layer's RoPE and KV-cache write in one: q and k rotated as ``rope_rotate``
rotates them, the rotated k and v stored (in the caches' dtype) at the step's slots.  The Triton kernel reads q,
k and v in place from the q/k/v GEMM's output (strided views) and writes nothing else.

``router_topk`` is a MoE router: logits = x W^T + b in float32 (x and W upcast exactly), then the routing
rule ``topk_softmax`` (GPT-OSS: top-k of the logits, softmax over those k) or ``softmax_topk`` (Qwen3-MoE:
softmax over every expert, top-k, renormalised to sum 1 if ``norm_topk_prob``), ids in descending order of
weight.  The Triton kernel sums each logit in another order than cuBLAS (float32 either way, within a few
ulps of the logit), so an id may differ only where two logits tie that closely.

``add_rmsnorm`` is the residual add of a decoder layer followed by the next RMSNorm: s = x + y rounded to
the dtype, then RMSNorm(s) with the specified sum of squares of :func:`.fused_act_quant_ref.rms_norm`
(the order ``rmsnorm_act_quant`` specifies), so it may differ from the engine's unfused ``RMSNorm`` in
the last float32 bits of the mean, as that op does.  The engine fuses it for bfloat16 activations only.
"""

from __future__ import annotations

import torch

from . import dispatch
from .fused_act_quant_ref import ORDERS, rms_norm

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
    """x [T, H, D] rotated by the per-token table cos, sin [T, D/2] (module docstring)."""
    check_rope(x, cos, sin, style)
    d = x.shape[-1]
    c, s = cos[:, None], sin[:, None]
    x1, x2 = (x[..., : d // 2], x[..., d // 2 :]) if style == "half" else (x[..., 0::2], x[..., 1::2])
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def check_add_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"RMSNorm order must be one of {ORDERS}, not {order!r}")
    if x.shape != y.shape or x.dtype != y.dtype or x.dtype not in DTYPES:
        raise ValueError(f"add_rmsnorm adds two tensors of one shape and dtype in {DTYPES}, got {x.dtype}{tuple(x.shape)} and {y.dtype}{tuple(y.shape)}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"add_rmsnorm: weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    if order == "hf" and torch.promote_types(weight.dtype, x.dtype) != x.dtype:
        raise ValueError(f"add_rmsnorm: an 'hf'-order weight {weight.dtype} would promote {x.dtype} activations")


def add_rmsnorm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> tuple[torch.Tensor, torch.Tensor]:
    """(s = x + y, RMSNorm(s)), both in x.dtype (module docstring)."""
    check_add_norm(x, y, weight, order)
    s = x + y
    return s, rms_norm(s, weight, eps, order)


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
    """q rotated; k rotated and v stored at the caches' rows ``slots`` (module docstring)."""
    check_rope_cache(q, k, v, slots, k_cache, v_cache)
    q_rot = rope_rotate(q, cos, sin, style)
    k_cache[slots] = rope_rotate(k, cos, sin, style).to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)
    return q_rot


ROUTER_RULES = ("topk_softmax", "softmax_topk")  # the rules router_topk runs (DeepSeek's grouped sigmoid stays in the engine)
ROUTER_OP_TOKENS = 1024  # the engine's router_topk batches; a prefill's larger ones take torch's GEMM (the kernel re-reads the weight per 4 rows)


def topk_route(logits: torch.Tensor, rule: str, top_k: int, norm_topk_prob: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits [T, E] -> (weights [T, k], ids [T, k]) by ``rule`` (transformers GptOssTopKRouter /
    Qwen3MoeTopKRouter, call for call)."""
    if rule == "topk_softmax":
        top, idx = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top, dim=1), idx
    if rule != "softmax_topk":
        raise ValueError(f"router_topk rule must be one of {ROUTER_RULES}, not {rule!r}")
    top, idx = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float), top_k, dim=-1)
    if norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return top, idx


def check_router(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, rule: str) -> None:
    if rule not in ROUTER_RULES:
        raise ValueError(f"router_topk rule must be one of {ROUTER_RULES}, not {rule!r}")
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"router_topk takes x [T, H] and weight [E, H], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"router_topk: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    if not 0 < top_k <= weight.shape[0]:
        raise ValueError(f"router_topk: top_k {top_k} of {weight.shape[0]} experts")


def router_topk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, rule: str,
                norm_topk_prob: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(weights float32 [T, k], ids int64 [T, k]) of float32 logits x W^T + b (module docstring)."""
    check_router(x, weight, bias, top_k, rule)
    f = torch.float32
    logits = torch.nn.functional.linear(x.to(f), weight.to(f), None if bias is None else bias.to(f))
    return topk_route(logits, rule, top_k, norm_topk_prob)


OPS = {"rope_rotate": rope_rotate, "rope_cache_write": rope_cache_write, "add_rmsnorm": add_rmsnorm, "router_topk": router_topk}
for _op, _fn in OPS.items():
    dispatch.register(_op, dispatch.REFERENCE, _fn)
