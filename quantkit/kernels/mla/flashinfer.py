"""FlashInfer backend of ``mla_decode``: ``flashinfer.mla.BatchMLAPagedAttentionWrapper`` (0.5.x; lazy import, CUDA
only), compiled for rank 512, rope 64.  It runs on the caches viewed by pages; its plan copies indices to the host.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .. import dispatch
from ..attention.flashinfer import NAME, PRIORITY, WORKSPACE_BYTES, available, missing, pages
from . import select
from .mla_ref import check_mla


class MLADecode:
    """One MLA decode configuration and its workspace."""

    def __init__(self, device: torch.device | str, dtype: torch.dtype, num_heads: int, rank: int, rope: int, *,
                 scale: float, backend: str = "auto") -> None:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        self.device = torch.device(device)
        self.dtype, self.heads, self.rank, self.rope, self.scale = dtype, num_heads, rank, rope, scale
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._wrapper: Any = BatchMLAPagedAttentionWrapper(self.workspace, backend=backend)
        self._block_size = 0
        self._owner: weakref.ref | None = None

    def plan(self, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> None:
        """One query per sequence over its keys."""
        indptr, indices, _ = pages(block_tables, context_lens, block_size)
        qo_indptr = torch.arange(context_lens.shape[0] + 1, dtype=torch.int32, device=self.device)
        self._wrapper.plan(qo_indptr, indptr, indices, context_lens.to(torch.int32), self.heads, self.rank, self.rope,
                           block_size, False, self.scale, self.dtype, self.dtype)
        self._block_size = block_size
        self._owner = None

    def plan_for(self, owner: object, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> None:
        """:meth:`plan` unless the last plan was for ``owner`` (a step: its layers share a plan)."""
        if self._owner is not None and self._owner() is owner:
            return
        self.plan(block_tables, context_lens, block_size)
        self._owner = weakref.ref(owner)

    def run(self, q_lat: torch.Tensor, q_rot: torch.Tensor, kv: torch.Tensor, k_rot: torch.Tensor) -> torch.Tensor:
        """-> [B, H, rank], as planned."""
        bs = self._block_size
        if bs == 0:
            raise RuntimeError("MLADecode.run before plan")
        ckv = kv.view(kv.shape[0] // bs, bs, kv.shape[1])  # [pages, page_size, rank]
        kpe = k_rot.view(k_rot.shape[0] // bs, bs, k_rot.shape[1])
        return self._wrapper.run(q_lat.contiguous(), q_rot.contiguous(), ckv, kpe)


def mla_decode(q_lat, q_rot, kv, k_rot, block_tables, context_lens, block_size, scale, *, step=None, state=None) -> torch.Tensor:
    """:func:`.mla_ref.mla_decode`; with ``step`` and ``state``, one :class:`MLADecode` kept in ``state`` and planned
    once per step, else one planned per call."""
    if step is None or state is None:
        check_mla(q_lat, q_rot, kv, k_rot, block_tables, context_lens)
        dec = MLADecode(q_lat.device, q_lat.dtype, q_lat.shape[1], q_lat.shape[2], q_rot.shape[2], scale=scale)
        dec.plan(block_tables, context_lens, block_size)
        return dec.run(q_lat, q_rot, kv, k_rot)
    key = ("mla_flashinfer", q_lat.device, q_lat.dtype, q_lat.shape[1], q_lat.shape[2], q_rot.shape[2], scale)
    dec = state.get(key)
    if dec is None:
        dec = state[key] = MLADecode(*key[1:6], scale=scale)
    dec.plan_for(step, block_tables, context_lens, block_size)
    return dec.run(q_lat, q_rot, kv, k_rot)


if (_why := missing()) is None:
    select.register(NAME, mla_decode, available=available, priority=PRIORITY)
else:
    dispatch.register_missing(NAME, _why)
