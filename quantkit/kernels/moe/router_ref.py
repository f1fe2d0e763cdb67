"""The ``router_topk`` op's torch reference (Triton: :mod:`.router`).

``router_topk(x [T, H], weight [E, H], bias [E] or None, top_k, rule, norm_topk_prob)`` -> (weights float32 [T, k],
ids int64 [T, k], descending weight): float32 logits x W^T + b, then ``topk_softmax`` (GPT-OSS) or ``softmax_topk``
(Qwen3-MoE).  A kernel may sum a logit in another order, so ids may differ only where two logits tie within ulps.
"""

from __future__ import annotations

import torch

from .. import dispatch

ROUTER_RULES = ("topk_softmax", "softmax_topk")  # the rules router_topk runs (DeepSeek's grouped sigmoid stays in the engine)
ROUTER_OP_TOKENS = 1024  # the engine's router_topk batches; larger ones take torch's GEMM (the kernel re-reads the weight per 4 rows)


def topk_route(logits: torch.Tensor, rule: str, top_k: int, norm_topk_prob: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits [T, E] -> (weights [T, k], ids [T, k]), transformers' routers call for call."""
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
    """See the module docstring."""
    check_router(x, weight, bias, top_k, rule)
    f = torch.float32
    logits = torch.nn.functional.linear(x.to(f), weight.to(f), None if bias is None else bias.to(f))
    return topk_route(logits, rule, top_k, norm_topk_prob)


dispatch.register("router_topk", dispatch.REFERENCE, router_topk)
