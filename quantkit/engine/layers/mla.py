"""DeepSeek Multi-head Latent Attention (transformers DeepseekV3Attention, DeepSeek inference/model.py MLA).

q = q_b(q_a_norm(q_a(x))) (or q_proj(x) without q_lora_rank), split per head into
q_nope [qk_nope_head_dim] | q_rot [qk_rope_head_dim].  kv_a_proj_with_mqa(x) = latent
[kv_lora_rank] | k_rot [qk_rope_head_dim] (one rotary key shared by all heads); the latent is
RMS-normed (eps 1e-6 in both references) and cached with the rotated k_rot.  Softmax scale:
:func:`rope.mla_softmax_scale`.  Two ways to attend, the same function up to float summation order:

* prefill (and cache-less steps, and steps mixing a prefill chunk with decode tokens): the cached
  latents of a sequence are expanded through kv_b_proj into per-head k_nope [qk_nope] | v
  [v_head_dim] ("naive" MLA, transformers); key = k_nope | k_rot; the ``attention_prefill`` op
  runs over those ragged keys.
* decode (one new token per sequence, with a cache): weight-absorbed MLA (DeepSeek's
  ``attn_impl="absorb"``).  kv_b_proj's weight [H * (qk_nope + v_head), rank] splits per head
  into W_UK [H, qk_nope, rank] and W_UV [H, v_head, rank]; q_lat = q_nope W_UK [H, rank], the
  ``mla_decode`` op attends over the cached latents themselves (:mod:`quantkit.kernels.mla.mla_ref`),
  out = o_lat W_UV^T [H, v_head], then o_proj.  W_UK / W_UV are kv_b_proj's dequantized weight
  in the compute dtype (DeepSeek's ``weight_dequant``), made on the first decode step and kept
  (2 * H * 128 * 512 values per layer at full size).

Both ways multiply the latents by the same dequantized W_UK / W_UV and never quantize the latents,
also where the other projections quantize their activations: DeepSeek's ``absorb`` reference
(inference/model.py) does so at prefill and decode alike.  Expanding through kv_b_proj's FP8 GEMM
instead quantizes the latents on the prefill path only, so a sequence's decode steps would read keys
other than the ones its prefill attended to (measured on tiny models: up to 0.8 nats of log-prob on
the CPU, 7 on the H200, where steps mixing prefill chunks with decodes agreed and pure decode steps
did not).
"""

from __future__ import annotations

import torch
from torch import nn

from ...kernels.dispatch import Dispatcher
from ..batch import Batch
from ..kv_cache import KVCache
from ..qlinear import Linear, RowGroup
from .attention import attend_batch
from .norm import RMSNorm, norm_quantized
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
        if kv_b_proj.bias is not None:
            raise ValueError("MLA: kv_b_proj with a bias has no weight-absorbed decode (DeepSeek's has none)")
        self._absorbed: tuple[torch.dtype, torch.device, torch.Tensor, torch.Tensor] | None = None  # (dtype, device, W_UK, W_UV)
        # q_a_proj (or q_proj) and kv_a_proj_with_mqa take the same input: one GEMM where they stack
        self.qkv_a = RowGroup((q_proj if q_proj is not None else q_a_proj, kv_a_proj))

    def cache_spec(self) -> dict[str, tuple[int, ...]]:
        return {"kv": (self.rank,), "k_rot": (self.rope_dim,)}

    def _expand(self, ctx: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of latents [m, rank] through the absorbed path's W_UK / W_UV (two GEMMs in the compute dtype)."""
        lat = ctx["kv"]
        m = lat.shape[0]
        w_uk, w_uv = self.absorbed_weights(lat.dtype, lat.device)
        k_nope = (lat @ w_uk.view(-1, self.rank).T).view(m, self.num_heads, self.nope)
        v = (lat @ w_uv.view(-1, self.rank).T).view(m, self.num_heads, self.v_dim)
        k_rot = ctx["k_rot"][:, None, :].expand(m, self.num_heads, self.rope_dim)
        return torch.cat((k_nope, k_rot), dim=-1), v

    def absorbed_weights(self, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, qk_nope, rank], W_UV [H, v_head, rank]) in ``dtype``: kv_b_proj's dequantized weight, made once."""
        a = self._absorbed
        if a is None or a[0] != dtype or a[1] != device:
            w = self.kv_b_proj.weight.dequant().view(self.num_heads, self.nope + self.v_dim, self.rank)  # float32
            w_uk, w_uv = (t.to(device=device, dtype=dtype).contiguous() for t in w.split([self.nope, self.v_dim], dim=1))
            a = self._absorbed = (dtype, device, w_uk, w_uv)
        return a[2], a[3]

    def _decode(self, q_nope: torch.Tensor, q_rot: torch.Tensor, new: dict[str, torch.Tensor], batch: Batch, cache: KVCache) -> torch.Tensor:
        """Weight-absorbed decode of one token per sequence -> [B, H, v_head] in q's dtype."""
        cache.write(self.layer, batch.slot_mapping, new)
        w_uk, w_uv = self.absorbed_weights(q_nope.dtype, q_nope.device)
        q_lat = torch.einsum("thd,hdc->thc", q_nope, w_uk).contiguous()  # [B, H, rank]
        store = cache.layers[self.layer]  # kv [slots, rank], k_rot [slots, rope]
        o_lat = self._attend_latents(q_lat, q_rot.contiguous(), store["kv"], store["k_rot"], batch)
        return torch.einsum("thc,hdc->thd", o_lat, w_uv)  # [B, H, v_head]

    def _attend_latents(self, q_lat: torch.Tensor, q_rot: torch.Tensor, kv: torch.Tensor, k_rot: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The ``mla_decode`` op.  ``step`` and ``state`` let its selection plan FlashInfer's MLA once per step's batch,
        kept in the dispatcher the model's layers share (:mod:`quantkit.kernels.mla.select`)."""
        return self.ops.call("mla_decode", q_lat, q_rot, kv, k_rot, batch.block_tables, batch.attn.context_lens, batch.block_size,
                             self.scale, step=batch, state=self.ops.state)

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        """forward(norm(x)) (the decoder layers' interface, see :class:`.attention.Attention`): the norm
        fused with the input quantization that the first query projection (q_a_proj, or q_proj) and
        kv_a_proj share, where they quantize alike (:func:`.norm.norm_quantized`); likewise q_a_layernorm
        with q_b_proj's."""
        a = norm_quantized(norm, self.qkv_a.parts, x)
        if a is None:
            return self.forward(norm(x), batch, cache)
        return self._forward(*self.qkv_a.quantized(*a, x.dtype), batch, cache)

    def forward(self, x: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        return self._forward(*self.qkv_a(x), batch, cache)

    def _forward(self, q0: torch.Tensor, kv_a: torch.Tensor, batch: Batch, cache: KVCache | None) -> torch.Tensor:
        """The layer from its first projections: q0 = q_proj(x), or q_a_proj(x) (then q_a_layernorm and
        q_b_proj here), and kv_a = kv_a_proj_with_mqa(x)."""
        t = q0.shape[0]
        q = q0 if self.q_proj is not None else self._q_b(q0)
        q = q.view(t, self.num_heads, self.nope + self.rope_dim)
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_rot = kv_a.split([self.rank, self.rope_dim], dim=-1)
        new = {"kv": self.kv_a_norm(latent), "k_rot": self.rope(k_rot[:, None, :], batch.positions, batch, self.ops)[:, 0]}
        q_rot = self.rope(q_rot, batch.positions, batch, self.ops)
        if cache is not None and batch.attn.decode:
            o = self._decode(q_nope, q_rot, new, batch, cache)
        else:
            q = torch.cat((q_nope, q_rot), dim=-1)
            o = attend_batch(self.layer, batch, cache, q, new, self._expand, scale=self.scale, ops=self.ops)
        return self.o_proj(o.reshape(t, self.num_heads * self.v_dim))

    def _q_b(self, qa: torch.Tensor) -> torch.Tensor:
        """q_b_proj(q_a_layernorm(qa)), the norm fused with q_b_proj's input quantization where it can be."""
        a = norm_quantized(self.q_a_norm, (self.q_b_proj,), qa)
        if a is None:
            return self.q_b_proj(self.q_a_norm(qa))
        return self.q_b_proj.quantized(*a, qa.dtype)
