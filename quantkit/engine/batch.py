"""Attention metadata of one forward step (the flat-token layout of vLLM / nano-vllm).

The tokens of all sequences in a step are concatenated: ``input_ids`` [T], ``positions`` [T].
Sequence b owns rows ``cu_seqlens[b]:cu_seqlens[b+1]`` (a prefill chunk of many tokens or a
decode step of one).  With a KV cache, each new token is written to cache slot
``slot_mapping[t]`` and sequence b then attends to its first ``context_lens[b]`` tokens, found
through its block table (slot = block * block_size + offset, as a paged-attention kernel reads
them); key i of a sequence has position i.  Without a cache, a sequence attends to its own new
tokens only, at their given positions.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch


@dataclass(frozen=True, eq=False)
class AttnMeta:
    """A step's index tensors as the attention ops take them (on the batch's device)."""

    cu_seqlens_q: torch.Tensor  # int32 [B+1]
    cu_seqlens_k: torch.Tensor  # int32 [B+1]: keys per sequence (the cache context, or the new tokens)
    context_lens: torch.Tensor | None  # int32 [B] with a cache
    max_seqlen_q: int
    decode: bool  # a cached step of one new token per sequence


@dataclass(frozen=True)
class Batch:
    cu_seqlens: tuple[int, ...]  # B+1 query segment boundaries in the flat tokens
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor | None = None  # [T] int64: cache slot of each new token
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int64, -1 past a sequence's blocks
    context_lens: tuple[int, ...] | None = None  # keys per sequence after this step's writes
    block_size: int = 0
    meta: AttnMeta | None = None  # the attention ops' index tensors, made ahead (a CUDA-graph decode step's static buffers)
    memo: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)  # per-step values every layer shares

    def memoized(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()`` once per step (this batch): tables every layer of the step reads alike (RoPE's cos / sin)."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    @classmethod
    def prefill(cls, lengths: Sequence[int], device: torch.device | str = "cpu") -> Batch:
        """Cache-less step: sequence b is ``lengths[b]`` new tokens at positions 0..n-1."""
        if not lengths or min(lengths) < 1:
            raise ValueError(f"every sequence needs at least one token, got lengths {list(lengths)}")
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + int(n))
        pos = torch.cat([torch.arange(int(n), device=device) for n in lengths])
        return cls(tuple(cu), pos)

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def uses_cache(self) -> bool:
        return self.slot_mapping is not None

    def segments(self) -> list[tuple[int, int]]:
        c = self.cu_seqlens
        return [(c[b], c[b + 1]) for b in range(self.num_seqs)]

    def last_token_rows(self) -> list[int]:
        """Row of each sequence's last token (where the next-token logits are)."""
        return [e - 1 for _, e in self.segments()]

    def context_slots(self, b: int) -> torch.Tensor:
        """Cache slots of sequence b's keys, oldest first: int64 [context_lens[b]]."""
        if self.block_tables is None or self.context_lens is None:
            raise ValueError("this batch has no KV cache metadata")
        n = self.context_lens[b]
        nb = -(-n // self.block_size)
        blocks = self.block_tables[b, :nb]
        offs = torch.arange(self.block_size, device=blocks.device)
        return (blocks[:, None] * self.block_size + offs).flatten()[:n]

    @cached_property
    def attn(self) -> AttnMeta:
        """Index tensors of the attention ops (cached on the batch: one step, many layers)."""
        if self.meta is not None:
            return self.meta
        dev = self.positions.device
        cu_q = torch.tensor(self.cu_seqlens, dtype=torch.int32, device=dev)
        lens = [e - s for s, e in self.segments()]
        if self.context_lens is None:
            self._check_consecutive()
            return AttnMeta(cu_q, cu_q, None, max(lens), False)
        cu_k = [0]
        for n in self.context_lens:
            cu_k.append(cu_k[-1] + n)
        ctx = torch.tensor(self.context_lens, dtype=torch.int32, device=dev)
        cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=dev)
        return AttnMeta(cu_q, cu_k_t, ctx, max(lens), max(lens) == 1)

    def _check_consecutive(self) -> None:
        step = self.positions[1:] - self.positions[:-1]
        inner = torch.ones_like(step, dtype=torch.bool)
        inner[[e - 1 for _, e in self.segments()[:-1]]] = False  # across a sequence boundary anything goes
        if bool((step[inner] != 1).any()):
            raise ValueError("positions of a sequence must be consecutive (each sequence's keys sit at consecutive positions)")

    def check(self, input_ids: torch.Tensor) -> None:
        if input_ids.dim() != 1 or input_ids.shape[0] != self.num_tokens or self.positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids {tuple(input_ids.shape)} and positions {tuple(self.positions.shape)} must both be [T] "
                f"with T = {self.num_tokens} tokens in this batch"
            )
