"""The ``fused_moe`` op's argument types and torch reference (a per-expert loop on :mod:`quantkit.formats`).

    out = fused_moe(x, topk_weights, topk_ids, w13, w2, spec)

* x [T, H] bf16 or f32; topk_weights float32 [T, k]; topk_ids integer [T, k] in [0, E).
* ``w13`` gate_up [E, 2I, H], ``w2`` down [E, H, I] (:class:`ExpertWeights`): E4M3 and scales of a format with
  activation quantization (:func:`fused_formats`; its ``weight_scale`` grid): ``fp8-block`` F32 [E, ceil(N/128),
  ceil(K/128)], ``mxfp8`` E8M0 [E, N, K/32]; optional bias [E, N].  Gate and up rows are interleaved (GPT-OSS:
  2j gate, 2j+1 up) or concatenated [gate | up] (:func:`stack_gate_up`).
* :class:`MoeSpec`: the activation (``silu``: silu(g) * u; ``gpt-oss``: (clamp(u, +-limit) + 1) * g *
  sigmoid(alpha * g), g <= limit) and the activation quantization (1x128 E4M3 with F32 or UE8M0 scales, or 1x32 MX).

Numerics, the engine's ``Experts`` step for step: x is quantized and dequantized once per token; per expert
h = act(x_dq @ W13.T + b13), projection and activation in x.dtype; y = (quant_dequant(h) @ W2.T + b2) in x.dtype;
out = sum over the token's experts (ascending id) of float32(y) * weight, rounded to x.dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import formats
from ...formats import Format, e8m0, fp8_block
from .. import dispatch

ACTIVATIONS = ("silu", "gpt-oss")


def fused_formats() -> tuple[str, ...]:
    """The formats whose experts the op takes: E4M3 weights with activation quantization (fp8-block, mxfp8)."""
    return formats.act_formats()


@dataclass(frozen=True, eq=False)  # holds tensors: compared by identity
class ExpertWeights:
    """Stacked expert weights, out x in: ``q`` E4M3 [E, N, K], ``scale``, optional ``bias`` [E, N]."""

    fmt: str
    q: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.fmt not in fused_formats():
            raise ValueError(f"expert format must be one of {fused_formats()}, not {self.fmt!r}")
        if self.q.dtype != torch.float8_e4m3fn or self.q.dim() != 3:
            raise ValueError(f"{self.fmt} experts need E4M3 [E, N, K], got {self.q.dtype}{tuple(self.q.shape)}")
        e, n, k = self.q.shape
        grid = self.format.weight_scale
        if not grid.partial and k % grid.cols:
            raise ValueError(f"{self.fmt} experts need K to be a multiple of {grid.cols}, got {k}")
        want, dtypes = (e, *grid.shape(n, k)), grid.dtypes
        if tuple(self.scale.shape) != want or self.scale.dtype not in dtypes:
            raise ValueError(f"{self.fmt} experts {tuple(self.q.shape)}: scales must be {dtypes[0]} {want}, got {self.scale.dtype}{tuple(self.scale.shape)}")
        if self.bias is not None and tuple(self.bias.shape) != (e, n):
            raise ValueError(f"{self.fmt} experts {tuple(self.q.shape)}: bias must be [{e}, {n}], got {tuple(self.bias.shape)}")

    @property
    def format(self) -> Format:
        return formats.get(self.fmt)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]

    def dequant(self, e: int) -> torch.Tensor:
        """float32 [N, K] of expert ``e``."""
        return self.format.dequantize_weight(self.q[e], self.scale[e])


@dataclass(frozen=True)
class MoeSpec:
    activation: str = "silu"
    interleaved: bool = False  # gate/up rows: GPT-OSS interleaved, else [gate | up]
    alpha: float = 1.702
    limit: float = 7.0
    scale_fmt: str = "float"  # fp8-block activation scales: "float" | "ue8m0"
    rule: str = e8m0.DEFAULT_RULE  # E8M0 rule for mxfp8 activations and ue8m0 scales

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"expert activation must be one of {ACTIVATIONS}, not {self.activation!r}")
        if self.scale_fmt not in fp8_block.SCALE_FMTS:
            raise ValueError(f"activation scale format must be one of {fp8_block.SCALE_FMTS}, not {self.scale_fmt!r}")
        e8m0.check_rule(self.rule)


def stack_gate_up(gate: ExpertWeights, up: ExpertWeights) -> ExpertWeights:
    """Gate and up [E, I, H] -> [E, 2I, H] = [gate | up], scales and biases alike; I must be whole scale tiles
    (FP8-block: I % 128 == 0)."""
    if gate.fmt != up.fmt or gate.shape != up.shape or (gate.bias is None) != (up.bias is None):
        raise ValueError(f"gate {gate.fmt}{gate.shape} and up {up.fmt}{up.shape} experts differ")
    tile = gate.format.weight_scale.rows
    if gate.shape[1] % tile:
        raise ValueError(f"{gate.fmt} gate/up with I={gate.shape[1]} cannot be stacked: {tile}-row tiles would straddle gate and up")
    bias = None if gate.bias is None else torch.cat([gate.bias, up.bias], 1)
    return ExpertWeights(gate.fmt, torch.cat([gate.q, up.q], 1), torch.cat([gate.scale, up.scale], 1), bias)


def check_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights) -> tuple[int, int, int, int]:
    """Shapes of one fused_moe call -> (T, H, I, E); raises ValueError naming the mismatch."""
    e, n2, h = w13.shape
    if w2.shape != (e, h, n2 // 2) or n2 % 2 or w13.fmt != w2.fmt:
        raise ValueError(f"gate_up {w13.fmt}{w13.shape} and down {w2.fmt}{w2.shape} must be [E, 2I, H] and [E, H, I] of one format")
    if x.dim() != 2 or x.shape[1] != h or x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"fused_moe input must be bf16/f32 [T, {h}], got {x.dtype}{tuple(x.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.is_floating_point():
        raise ValueError(f"topk ids {tuple(topk_ids.shape)} / weights {tuple(topk_weights.shape)} must be [T, k] for T={x.shape[0]}")
    return x.shape[0], h, n2 // 2, e


def quant_dequant(x: torch.Tensor, fmt: str, spec: MoeSpec) -> torch.Tensor:
    """The activation as the GEMM sees it: dynamically quantized per token, dequantized, float32."""
    f = formats.get(fmt)
    return f.dequantize_act(*f.quantize_act(x, spec.scale_fmt, spec.rule))


def activation(g: torch.Tensor, u: torch.Tensor, spec: MoeSpec) -> torch.Tensor:
    """The engine's expert activation, in the dtype of g and u."""
    if spec.activation == "silu":
        return F.silu(g) * u
    g = g.clamp(min=None, max=spec.limit)
    u = u.clamp(min=-spec.limit, max=spec.limit)
    return (u + 1) * (g * torch.sigmoid(g * spec.alpha))


def _bias(w: ExpertWeights, e: int, rows: slice) -> torch.Tensor | None:
    return None if w.bias is None else w.bias[e, rows].to(torch.float32)


def _expert(xq: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights, e: int, spec: MoeSpec, dtype: torch.dtype) -> torch.Tensor:
    """One expert on its tokens' dequantized activations xq float32 [n, H] -> dtype [n, H]."""
    inter = w13.shape[1] // 2
    w = w13.dequant(e)  # [2I, H]
    if spec.interleaved:
        gu = F.linear(xq, w, _bias(w13, e, slice(None))).to(dtype)
        g, u = gu[:, 0::2], gu[:, 1::2]
    else:  # two linears, as the engine's separate gate and up weights
        g = F.linear(xq, w[:inter], _bias(w13, e, slice(0, inter))).to(dtype)
        u = F.linear(xq, w[inter:], _bias(w13, e, slice(inter, None))).to(dtype)
    h = activation(g, u, spec)
    return F.linear(quant_dequant(h, w2.fmt, spec), w2.dequant(e), _bias(w2, e, slice(None))).to(dtype)


def dequant_input(x_q: tuple[torch.Tensor, torch.Tensor], fmt: str) -> torch.Tensor:
    """Activations quantized as :func:`quant_dequant` quantizes them (E4M3 + their scales) -> float32."""
    return formats.get(fmt).dequantize_act(*x_q)


def fused_moe_ref(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: ExpertWeights, w2: ExpertWeights,
                  spec: MoeSpec, *, x_q: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
    """Per-expert loop (host-synchronising).  ``x_q``: x already quantized by the op's rule (an expert-parallel
    dispatch's payload); x then gives only the shape and dtype."""
    check_moe(x, topk_weights, topk_ids, w13, w2)
    xq = quant_dequant(x, w13.fmt, spec) if x_q is None else dequant_input(x_q, w13.fmt)  # float32 [T, H]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
    for e in torch.unique(topk_ids).tolist():
        rows, slot = torch.where(topk_ids == e)
        y = _expert(xq[rows], w13, w2, e, spec, x.dtype).to(torch.float32) * topk_weights[rows, slot, None].to(torch.float32)
        out.index_add_(0, rows, y)
    return out.to(x.dtype)


dispatch.register("fused_moe", dispatch.REFERENCE, fused_moe_ref)
