"""Rotary position embeddings: default and YaRN frequencies, half-split and interleaved pairs.

Frequencies follow transformers 5.24 ``modeling_rope_utils`` (``_compute_default_rope_parameters``,
``_compute_yarn_parameters``) operation for operation, so inv_freq is bit-identical:

* YaRN: inv_freq blends interpolation (1/(factor * base**(2i/d))) and extrapolation with a linear
  ramp between the correction dims of beta_fast/beta_slow (floor/ceil'd unless ``truncate`` is
  false, as GPT-OSS sets).  cos/sin are multiplied by the attention factor: explicit
  ``attention_factor``, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when
  both are set (DeepSeek-V3: 1.0), else 0.1 ln(factor) + 1 (GPT-OSS "concentration" 1.3466).
* DeepSeek additionally multiplies the softmax scale by get_mscale(factor, mscale_all_dim)**2
  (:func:`mla_softmax_scale`, transformers ``yarn_apply_mscale``, DeepSeek inference/model.py).

Styles: ``half`` rotates (x[:d/2], x[d/2:]) pairs (NeoX; GPT-OSS, Qwen3, DeepSeek with
rope_interleave false).  ``interleaved`` rotates (x[2i], x[2i+1]) pairs, DeepSeek's own layout; like
transformers' ``apply_rotary_pos_emb_interleave`` it writes the rotated evens then the rotated odds.
That permutes q_rot and k_rot the same way, so every q.k product equals DeepSeek's reference.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...kernels.dispatch import Dispatcher
from ...kernels.attention.rope_ref import DTYPES as ROPE_DTYPES
from ..batch import Batch

STYLES = ("half", "interleaved")


def rope_parameters(config: dict, default_theta: float = 10000.0) -> dict:
    """config.json's ``rope_parameters`` (transformers v5) or legacy ``rope_scaling`` + ``rope_theta``."""
    p = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    p.setdefault("rope_theta", config.get("rope_theta", default_theta))
    p["rope_type"] = p.get("rope_type", p.get("type", "default"))
    if p["rope_type"] == "yarn":
        p.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
        if p.get("factor") is None:  # transformers: the ratio of the context lengths
            p["factor"] = config["max_position_embeddings"] / p["original_max_position_embeddings"]
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor {p['partial_rotary_factor']} is not supported")
    if p["rope_type"] not in ("default", "yarn"):
        raise ValueError(f"rope_type {p['rope_type']!r} is not supported (default, yarn)")
    return p


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(p: dict, dim: int) -> tuple[torch.Tensor, float]:
    base, factor, orig = p["rope_theta"], p["factor"], p["original_max_position_embeddings"]
    att = p.get("attention_factor")
    if att is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        att = float(get_mscale(factor, ms) / get_mscale(factor, ms_all)) if ms and ms_all else get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, float(att)


def inv_freq_and_scale(p: dict, dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq float32 [dim/2], cos/sin multiplier) for :func:`rope_parameters` ``p``."""
    if p["rope_type"] == "yarn":
        return _yarn(p, dim)
    return 1.0 / (p["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0


def mla_softmax_scale(p: dict, qk_head_dim: int) -> float:
    """DeepSeek MLA softmax scale: qk_head_dim**-0.5 times mscale(factor, mscale_all_dim)**2 under YaRN."""
    scale = qk_head_dim**-0.5
    if p["rope_type"] != "default" and p.get("mscale_all_dim"):
        m = get_mscale(p["factor"], p["mscale_all_dim"])
        scale = scale * m * m
    return scale


class Rope(nn.Module):
    def __init__(self, dim: int, params: dict, style: str = "half") -> None:
        super().__init__()
        if style not in STYLES:
            raise ValueError(f"rope style must be one of {STYLES}, not {style!r}")
        inv, self.scale = inv_freq_and_scale(params, dim)
        self.register_buffer("inv_freq", inv)
        self.style = style
        self.dim = dim

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, dim/2] (broadcast over heads), cast to ``dtype`` as transformers does."""
        if self.inv_freq.device != positions.device:  # made on the CPU at build: moved once, not copied per call
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq
        cos, sin = freqs.cos() * self.scale, freqs.sin() * self.scale
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]

    def table(self, positions: torch.Tensor, memo: Batch | None, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, dim/2] of ``positions``; with ``memo`` (the step's batch, whose positions these are) made once
        per step and dtype and shared by every layer."""
        if memo is None:
            return self.cos_sin(positions, dtype)
        return memo.memoized(("rope", id(self), dtype), lambda: self.cos_sin(positions, dtype))

    def kernel_ok(self, x: torch.Tensor) -> bool:
        """Whether the rotation ops (``rope_rotate``, ``rope_cache_write``) take x [T, heads, dim]."""
        return x.dim() == 3 and x.stride(-1) == 1 and x.dtype in ROPE_DTYPES

    def forward(self, x: torch.Tensor, positions: torch.Tensor, memo: Batch | None = None, ops: Dispatcher | None = None) -> torch.Tensor:
        """x [T, heads, dim] rotated by each token's position (table: :meth:`table`); with ``ops`` (the model's
        dispatcher) the rotation is the ``rope_rotate`` op (one launch on a GPU; the same bytes)."""
        cos, sin = self.table(positions, memo, x.dtype)
        if ops is not None and self.kernel_ok(x):
            return ops.call("rope_rotate", x, cos[:, 0], sin[:, 0], self.style)
        if self.style == "half":
            x1, x2 = x[..., : self.dim // 2], x[..., self.dim // 2 :]
        else:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
