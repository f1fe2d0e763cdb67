"""FlashInfer backend of ``mla_decode`` (FlashInfer 0.5.x ``flashinfer.mla.BatchMLAPagedAttentionWrapper``;
imported lazily, CUDA only).

FlashInfer's MLA wrapper (flashinfer/mla.py) computes the weight-absorbed MLA of :mod:`.mla`:
``run(q_nope, q_pe, ckv_cache, kpe_cache)`` with q_nope = our q_lat [B, H, rank] (its
"head_dim_ckv"), q_pe = q_rot [B, H, rope] ("head_dim_kpe"), and the caches laid out
[num_pages, page_size, dim], which is the engine's [slots, dim] cache viewed by pages.  ``plan``
takes qo_indptr int32 [B+1] (0..B for decode), kv_indptr int32 [B+1] (pages per sequence,
cumulated), kv_indices int32 (the pages, sequence after sequence), kv_len_arr int32 [B] (keys
per sequence), the head count and dims, page_size, causal, sm_scale (the MLA softmax scale, as
ours), q and kv dtypes.  Its kernels are compiled for DeepSeek's dims (rank 512, rope 64);
``backend`` "fa2" or "fa3" (Hopper), "auto" lets FlashInfer choose.

:class:`MLADecode` plans once per batch layout and runs per layer: the engine's MLA layers
(:mod:`quantkit.engine.layers.mla`) share one through their dispatcher and re-plan it when a new
step's batch arrives (:meth:`MLADecode.plan_for`), wherever :func:`step_plan_ok` allows, under
``backend="auto"`` or ``"flashinfer"``.  The registered op function builds and plans one per call
(plan copies indices to the host), so the dispatcher's ``auto`` never picks it; ask for
``backend="flashinfer"`` explicitly.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from .. import dispatch
from ..attention.flashinfer import NAME, PRIORITY, WORKSPACE_BYTES, available, missing, pages
from .mla_ref import check_mla


class MLADecode:
    """One FlashInfer MLA decode configuration (heads, dims, scale, dtype) with its workspace."""

    def __init__(self, device: torch.device | str, dtype: torch.dtype, num_heads: int, rank: int, rope: int, *,
                 scale: float, backend: str = "auto") -> None:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        self.device = torch.device(device)
        self.dtype, self.heads, self.rank, self.rope, self.scale = dtype, num_heads, rank, rope, scale
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._wrapper: Any = BatchMLAPagedAttentionWrapper(self.workspace, backend=backend)
        self._block_size = 0
        self._owner: weakref.ref | None = None  # what the last plan_for planned for

    def plan(self, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> None:
        """One query per sequence over its ``context_lens[b]`` keys in the paged cache."""
        indptr, indices, _ = pages(block_tables, context_lens, block_size)
        qo_indptr = torch.arange(context_lens.shape[0] + 1, dtype=torch.int32, device=self.device)
        self._wrapper.plan(qo_indptr, indptr, indices, context_lens.to(torch.int32), self.heads, self.rank, self.rope,
                           block_size, False, self.scale, self.dtype, self.dtype)
        self._block_size = block_size
        self._owner = None

    def plan_for(self, owner: object, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> None:
        """:meth:`plan` unless the last plan was made for this same ``owner`` (one forward step's batch:
        every layer of the step runs on one plan; a different or a new batch re-plans)."""
        if self._owner is not None and self._owner() is owner:
            return
        self.plan(block_tables, context_lens, block_size)
        self._owner = weakref.ref(owner)

    def run(self, q_lat: torch.Tensor, q_rot: torch.Tensor, kv: torch.Tensor, k_rot: torch.Tensor) -> torch.Tensor:
        """q_lat [B, H, rank], q_rot [B, H, rope], caches [slots, rank|rope] as planned -> [B, H, rank]."""
        bs = self._block_size
        if bs == 0:
            raise RuntimeError("MLADecode.run before plan")
        ckv = kv.view(kv.shape[0] // bs, bs, kv.shape[1])  # [pages, page_size, rank]
        kpe = k_rot.view(k_rot.shape[0] // bs, bs, k_rot.shape[1])
        return self._wrapper.run(q_lat.contiguous(), q_rot.contiguous(), ckv, kpe)


STEP_DIMS = (512, 64)  # (rank, rope) FlashInfer 0.5's MLA kernels are built for (DeepSeek-V2/V3's)
STEP_DTYPES = (torch.bfloat16,)  # the dtype the H200 runs checked (docs/benchmarks.md, thirteenth pass)


def step_plan_ok(q_lat: torch.Tensor, q_rot: torch.Tensor) -> str | None:
    """None when a per-step :class:`MLADecode` can serve these queries (CUDA, FlashInfer installed,
    DeepSeek's latent dims, bf16), else why not."""
    if q_lat.device.type != "cuda":
        return f"FlashInfer runs on CUDA devices, got {q_lat.device.type}"
    if (q_lat.shape[-1], q_rot.shape[-1]) != STEP_DIMS:
        return f"FlashInfer's MLA kernels take rank {STEP_DIMS[0]} and rope {STEP_DIMS[1]}, got {q_lat.shape[-1]} and {q_rot.shape[-1]}"
    if q_lat.dtype not in STEP_DTYPES:
        return f"the per-step FlashInfer MLA path runs in bf16, got {q_lat.dtype}"
    return _missing()


_missing = functools.cache(missing)  # asked by every MLA layer of every decode step: look the package up once


def mla_decode(q_lat, q_rot, kv, k_rot, block_tables, context_lens, block_size, scale) -> torch.Tensor:
    """:func:`.mla.mla_decode` through FlashInfer (plans on every call)."""
    check_mla(q_lat, q_rot, kv, k_rot, block_tables, context_lens)
    attn = MLADecode(q_lat.device, q_lat.dtype, q_lat.shape[1], q_lat.shape[2], q_rot.shape[2], scale=scale)
    attn.plan(block_tables, context_lens, block_size)
    return attn.run(q_lat, q_rot, kv, k_rot)


def register() -> None:
    """Register the backend when its package is installed (attention_flashinfer records why it is absent)."""
    if missing() is not None:
        return
    dispatch.register("mla_decode", NAME, mla_decode, available=available, priority=PRIORITY)


register()
