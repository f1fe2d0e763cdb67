"""DeepSeek Multi-head Latent Attention (transformers DeepseekV3Attention, DeepSeek inference/model.py MLA).

q = q_b(q_a_norm(q_a(x))) (or q_proj(x) without q_lora_rank), split per head into
q_nope [qk_nope_head_dim] | q_rot [qk_rope_head_dim].  kv_a_proj_with_mqa(x) = latent
[kv_lora_rank] | k_rot [qk_rope_head_dim] (one rotary key shared by all heads); the latent is
RMS-normed (eps 1e-6 in both references) and cached with the rotated k_rot.  Each step expands the
cached latents of a sequence through kv_b_proj into per-head k_nope [qk_nope] | v [v_head_dim]
("naive" MLA); key = k_nope | k_rot; the ``attention_prefill`` op runs over those ragged keys.  Softmax scale: :func:`rope.mla_softmax_scale`.
"""

from __future__ import annotations

import torch
from torch import nn

from ...kernels.dispatch import Dispatcher
from ..batch import Batch
from ..kv_cache import KVCache
from ..qlinear import Linear
from .attention import attend_batch
from .norm import RMSNorm
from .rope import Rope


class MLA(nn.Module):
    def __init__(
        self,
        layer: int,
        *,
        q_proj: Linear | None,
        q_a_proj: Linear | None,
        q_a_norm: RMSNorm | None,
        q_b_proj: Linear | None,
        kv_a_proj: Linear,
        kv_a_norm: RMSNorm,
        kv_b_proj: Linear,
        o_proj: Linear,
        rope: Rope,
        num_heads: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        kv_lora_rank: int,
        scale: float,
        ops: Dispatcher | None = None,
    ) -> None:
        super().__init__()
        if (q_proj is None) == (q_b_proj is None):
            raise ValueError("MLA needs either q_proj or q_a_proj/q_a_layernorm/q_b_proj")
        self.layer = layer
        self.q_proj, self.q_a_proj, self.q_a_norm, self.q_b_proj = q_proj, q_a_proj, q_a_norm, q_b_proj
        self.kv_a_proj, self.kv_a_norm, self.kv_b_proj, self.o_proj = kv_a_proj, kv_a_norm, kv_b_proj, o_proj
        self.rope = rope
        self.num_heads = num_heads
        self.nope, self.rope_dim, self.v_dim, self.rank = qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank
        self.scale = scale
        self.ops = ops if ops is not None else Dispatcher()

    def cache_spec(self) -> dict[str, tuple[int, ...]]:
        return {"kv": (self.rank,), "k_rot": (self.rope_dim,)}

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    def _expand(self, ctx: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        m = ctx["kv"].shape[0]
        kv = self.kv_b_proj(ctx["kv"]).view(m, self.num_heads, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_rot = ctx["k_rot"][:, None, :].expand(m, self.num_heads, self.rope_dim)
        return torch.cat((k_nope, k_rot), dim=-1), v

    def forward(self, x: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        t = x.shape[0]
        q = self._queries(x).view(t, self.num_heads, self.nope + self.rope_dim)
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_rot = self.kv_a_proj(x).split([self.rank, self.rope_dim], dim=-1)
        latent = self.kv_a_norm(latent)
        q = torch.cat((q_nope, self.rope(q_rot, batch.positions)), dim=-1)
        k_rot = self.rope(k_rot[:, None, :], batch.positions)[:, 0]
        o = attend_batch(self.layer, batch, cache, q, {"kv": latent, "k_rot": k_rot}, self._expand, scale=self.scale, ops=self.ops)
        return self.o_proj(o.reshape(t, self.num_heads * self.v_dim))
