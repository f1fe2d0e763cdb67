"""Mixture of experts: the three routing rules, the experts, and the MoE block.

Routing (router logits in float32; references: transformers GptOssTopKRouter, Qwen3MoeTopKRouter,
DeepseekV3TopkRouter, which this follows call for call so ties break the same way):

* ``topk_softmax`` (GPT-OSS): logits = x W^T + b; top-k on the raw logits; softmax over those k.
* ``softmax_topk`` (Qwen3-MoE): softmax over all experts, top-k, renormalise to sum 1 if
  ``norm_topk_prob``.
* ``grouped_sigmoid`` (DeepSeek-V3): s = sigmoid(x W^T); experts are chosen with
  s + e_score_correction_bias: group score = sum of the group's top-2, keep the best
  ``topk_group`` of ``n_group`` groups, then the top-k experts within them; the weights are s
  WITHOUT the bias, renormalised (sum + 1e-20) if ``norm_topk_prob``, times routed_scaling_factor.

Experts hold stacked packed weights [E, out, in].  GPT-OSS fuses gate and up INTERLEAVED (row 2j
gate, 2j+1 up) with biases and the clamped SwiGLU (up + 1) * g * sigmoid(alpha * g), g = min(gate,
limit), up clamped to [-limit, limit]; per-expert families have separate gate/up and SiLU.

Compute: experts of a format with dynamic activation quantization (fp8-block, mxfp8) run the ``fused_moe``
op (:mod:`quantkit.kernels.moe.fused_moe_ref` is its torch reference, step for step the per-expert
loop here).  Its :class:`ExpertWeights` are built once at load from the packed buffers: GPT-OSS's
interleaved gate_up [E, 2I, H] (+ biases) as is; DeepSeek/Qwen gate and up stacked as
[E, 2I, H] = [gate | up] (``stack_gate_up``; the gate and up weights then become views of it, so
nothing is held twice).  Other experts (dense, MXFP4 w4a16, unquantized activations, fp8-block
with I % 128 != 0, where a 128-row tile would straddle gate and up) run the per-expert loop of
quantized linears; ``Experts.path`` says which and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ... import formats
from ...kernels.moe.fused_moe_ref import ExpertWeights, MoeSpec, fused_formats, stack_gate_up
from ...kernels.moe.router_ref import ROUTER_OP_TOKENS, ROUTER_RULES, topk_route
from ..qlinear import QWeight, linear, quantized

RULES = ("topk_softmax", "softmax_topk", "grouped_sigmoid")
ACTIVATIONS = ("silu", "gpt-oss")


@dataclass(frozen=True)
class Routing:
    rule: str
    top_k: int
    norm_topk_prob: bool = False
    n_group: int = 1
    topk_group: int = 1
    scaling: float = 1.0

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"routing rule must be one of {RULES}, not {self.rule!r}")


def route(logits: torch.Tensor, r: Routing, correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 router logits [T, E] -> (weights float32 [T, k], expert ids [T, k])."""
    if r.rule in ROUTER_RULES:
        return topk_route(logits, r.rule, r.top_k, r.norm_topk_prob)
    scores = logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias
    e = logits.shape[-1]
    groups = choice.view(-1, r.n_group, e // r.n_group).topk(2, dim=-1)[0].sum(dim=-1)
    gidx = torch.topk(groups, k=r.topk_group, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(groups).scatter_(1, gidx, 1)
    emask = gmask.unsqueeze(-1).expand(-1, r.n_group, e // r.n_group).reshape(-1, e)
    idx = torch.topk(choice.masked_fill(~emask.bool(), float("-inf")), k=r.top_k, dim=-1, sorted=False)[1]
    w = scores.gather(1, idx)
    if r.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * r.scaling, idx


class Router(nn.Module):
    """Router logits in float32, then the routing rule.  With ``ops`` (the model's dispatcher) the two top-k rules
    run as one ``router_topk`` op (quantkit/kernels/moe/router_ref.py) for up to ROUTER_OP_TOKENS tokens; it reads the
    weight as the checkpoint stored it where that is 16-bit (``weight_src``: bf16 upcasts exactly, so the float32
    products are the same)."""

    def __init__(self, weight: torch.Tensor, routing: Routing, bias: torch.Tensor | None = None, correction_bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("weight", weight.to(torch.float32))
        self.register_buffer("weight_src", weight if weight.dtype in (torch.bfloat16, torch.float16) else None, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.to(torch.float32))
        self.register_buffer("correction_bias", None if correction_bias is None else correction_bias.to(torch.float32))
        self.routing = routing

    def forward(self, x: torch.Tensor, ops=None) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.routing
        if ops is not None and r.rule in ROUTER_RULES and x.dim() == 2 and x.shape[0] <= ROUTER_OP_TOKENS:
            w = self.weight if self.weight_src is None else self.weight_src
            return ops.call("router_topk", x, w, self.bias, r.top_k, r.rule, r.norm_topk_prob)
        logits = torch.nn.functional.linear(x.to(torch.float32), self.weight, self.bias)
        return route(logits, r, self.correction_bias)


class Experts(nn.Module):
    def __init__(
        self,
        down: QWeight,
        *,
        gate_up: QWeight | None = None,
        gate: QWeight | None = None,
        up: QWeight | None = None,
        gate_up_bias: torch.Tensor | None = None,
        down_bias: torch.Tensor | None = None,
        activation: str = "silu",
        alpha: float = 1.702,
        limit: float = 7.0,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"expert activation must be one of {ACTIVATIONS}, not {activation!r}")
        if (gate_up is None) == (gate is None or up is None):
            raise ValueError("experts need either a fused interleaved gate_up or separate gate and up weights")
        self.gate_up, self.gate, self.up, self.down = gate_up, gate, up, down
        self.register_buffer("gate_up_bias", gate_up_bias)
        self.register_buffer("down_bias", down_bias)
        self.activation, self.alpha, self.limit = activation, alpha, limit
        self.num_experts = down.num_experts
        self.ops = down.ops
        self.fused, self.path = self._fuse()

    def _fuse(self) -> tuple[tuple[ExpertWeights, ExpertWeights, MoeSpec] | None, str]:
        """(w13, w2, spec) of the fused_moe op, or None and why the per-expert loop runs instead."""
        ws = [w for w in (self.gate_up, self.gate, self.up, self.down) if w is not None]
        fmts, acts = {w.fmt for w in ws}, {w.act for w in ws}
        if len(fmts) != 1 or not fmts <= set(fused_formats()):
            return None, f"per-expert loop: {'/'.join(sorted(fmts))} experts have no fused_moe"
        if len(acts) != 1 or None in acts:
            return None, "per-expert loop: activations are not quantized (or not alike) in every expert projection"
        fmt, act = fmts.pop(), acts.pop()
        spec = MoeSpec(self.activation, self.gate_up is not None, self.alpha, self.limit, act.scale_fmt, act.rule)
        w2 = ExpertWeights(fmt, *self.down.packed(), self.down_bias)
        if self.gate_up is not None:
            return (ExpertWeights(fmt, *self.gate_up.packed(), self.gate_up_bias), w2, spec), "fused_moe"
        inter, tile = self.gate.shape[0], self.gate.format.weight_scale.rows  # weight rows per scale row
        if inter % tile:
            return None, f"per-expert loop: {fmt} gate/up with I={inter} cannot be stacked ({tile}-row tiles would straddle them)"
        w13 = stack_gate_up(ExpertWeights(fmt, *self.gate.packed()), ExpertWeights(fmt, *self.up.packed()))
        rows, ops = inter // tile, self.ops  # scale rows of the gate half
        self.gate = quantized(self.gate.format, (w13.q[:, :inter], w13.scale[:, :rows]), act, ops)  # views: the loop and the op share w13
        self.up = quantized(self.up.format, (w13.q[:, inter:], w13.scale[:, rows:]), act, ops)
        return (w13, w2, spec), "fused_moe"

    def _act(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        if self.activation == "silu":
            return torch.nn.functional.silu(g) * u
        g = g.clamp(min=None, max=self.limit)
        u = u.clamp(min=-self.limit, max=self.limit)
        return (u + 1) * (g * torch.sigmoid(g * self.alpha))

    def expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """One expert on its tokens x [n, H] -> [n, H]."""
        if self.gate_up is not None:
            gu = linear(x, self.gate_up, self.gate_up_bias, expert=e)
            g, u = gu[..., 0::2], gu[..., 1::2]
        else:
            g, u = linear(x, self.gate, expert=e), linear(x, self.up, expert=e)
        return linear(self._act(g, u), self.down, self.down_bias, expert=e)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor,
                x_q: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
        """x [T, H], routing weights float32 [T, k] and expert ids [T, k] -> [T, H] in x.dtype.  ``x_q``: x as
        :meth:`quantize_input` quantized it (an expert-parallel dispatch's payload); x then gives shape and dtype."""
        if self.fused is None:
            if x_q is not None:
                raise ValueError(f"{self.path}: these experts take unquantized activations")
            return self.loop(x, weights, idx)
        w13, w2, spec = self.fused
        if x_q is None:
            return self.ops.call("fused_moe", x, weights, idx, w13, w2, spec)
        return self.ops.call("fused_moe", x, weights, idx, w13, w2, spec, x_q=x_q)

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """x [T, H] quantized as the fused_moe op quantizes its input (E4M3 + F32 1x128 or E8M0 1x32 scales),
        or None where these experts take unquantized activations (the per-expert loop)."""
        if self.fused is None:
            return None
        w13, _, spec = self.fused
        return formats.get(w13.fmt).act_quant(self.ops, x, spec.scale_fmt, spec.rule)

    def loop(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The per-expert loop (host-synchronising): each expert on its tokens, combined in float32."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(idx).tolist():
            rows, slot = torch.where(idx == e)
            y = self.expert(x[rows], e).to(torch.float32) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
        return out.to(x.dtype)


class MoE(nn.Module):
    """Routed experts (+ DeepSeek's always-on shared expert)."""

    def __init__(self, router: Router, experts: Experts, shared: nn.Module | None = None) -> None:
        super().__init__()
        self.router, self.experts, self.shared = router, experts, shared
        self.ep = None  # expert parallel (a rank's share of the experts, ...parallel.ExpertParallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, idx = self.router(x, self.experts.ops)
        y = self.experts(x, w, idx) if self.ep is None else self.ep.routed(self.experts, x, w, idx)
        return y if self.shared is None else y + self.shared(x)
