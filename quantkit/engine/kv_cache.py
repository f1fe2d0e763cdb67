"""Paged KV cache: fixed-size blocks of token slots, a block table per sequence.

Each attention layer declares what it stores per token (its ``cache_spec``): GQA layers
``k`` [n_kv, head_dim] and ``v`` [n_kv, v_dim]; DeepSeek MLA its compressed latent ``kv``
[kv_lora_rank] and the shared rotated key ``k_rot`` [qk_rope_head_dim] (as transformers and
DeepSeek cache them).  Storage per layer and name: [num_blocks * block_size, *shape] in the
model's compute dtype, so slot s of block b is row b * block_size + s.

:meth:`KVCache.schedule` is the interface a scheduler drives: it allocates blocks for the new
tokens of each sequence and returns the step's :class:`Batch` (positions continue each
sequence's length).  :meth:`release` returns a finished sequence's blocks.

Prefix caching: a full, written block can be indexed under a hash of its tokens chained with all the
tokens before it (:meth:`commit`); a new sequence whose prompt starts with such blocks starts on them
(:meth:`match`, :meth:`attach`), and blocks are counted per user (``refs``).  A released block stays
indexed while it waits in the free list, oldest freed first, until it is taken for new tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch

from .batch import Batch

CacheSpec = dict[str, tuple[int, ...]]


class KVCache:
    def __init__(
        self,
        specs: list[CacheSpec],
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        slots = num_blocks * block_size
        # per layer: name -> [slots, *shape]
        self.layers = [{n: torch.zeros(slots, *shape, dtype=dtype, device=device) for n, shape in s.items()} for s in specs]
        # free blocks, oldest freed first (an ordered set); a free block may still hold a cached prefix block
        self.free_blocks: dict[int, None] = dict.fromkeys(range(num_blocks))
        self.refs = [0] * num_blocks  # sequences using each block
        self.hash_of: dict[int, bytes] = {}  # block -> hash of its full, written contents (prefix caching)
        self.by_hash: dict[bytes, int] = {}
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}

    def _take(self, b: int) -> None:
        if self.refs[b] == 0:
            del self.free_blocks[b]
        self.refs[b] += 1

    def _grow(self, seq: Hashable, n_total: int) -> None:
        table = self.tables.setdefault(seq, [])
        need = -(-n_total // self.block_size) - len(table)
        if need > len(self.free_blocks):
            raise RuntimeError(f"KV cache out of blocks: sequence {seq!r} needs {need} more, {len(self.free_blocks)} free")
        for _ in range(need):
            b = next(iter(self.free_blocks))  # the least recently freed: evicts the coldest cached block
            if b in self.hash_of:
                del self.by_hash[self.hash_of.pop(b)]
            self._take(b)
            table.append(b)

    # --- prefix caching: full blocks indexed by the hash of their tokens and all before them ------------
    def match(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` (block i's hash chains blocks 0..i)."""
        out = []
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def reused(self, blocks: list[int]) -> int:
        """How many of these cached blocks sit in the free list (taking them uses free room)."""
        return sum(self.refs[b] == 0 for b in blocks)

    def attach(self, seq: Hashable, blocks: list[int]) -> None:
        """Start a new sequence on cached blocks: its first len(blocks) * block_size tokens are already written."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already has blocks")
        for b in blocks:
            self._take(b)
        self.tables[seq] = list(blocks)
        self.lengths[seq] = len(blocks) * self.block_size

    def commit(self, seq: Hashable, first: int, hashes: list[bytes]) -> None:
        """Index blocks first, first + 1, ... of a sequence (full and written) under their hashes."""
        for b, h in zip(self.tables[seq][first:], hashes):
            if b not in self.hash_of and h not in self.by_hash:
                self.hash_of[b], self.by_hash[h] = h, b

    def schedule(self, new_tokens: Mapping[Hashable, int]) -> Batch:
        """Allocate room for ``new_tokens[seq]`` more tokens of each sequence; the step's metadata."""
        cu, pos, slots, ctx = [0], [], [], []
        for seq, n in new_tokens.items():
            if n < 1:
                raise ValueError(f"sequence {seq!r}: a step needs at least one new token, got {n}")
            start = self.lengths.get(seq, 0)
            self._grow(seq, start + n)
            table = torch.tensor(self.tables[seq], dtype=torch.int64)
            p = torch.arange(start, start + n)
            pos.append(p)
            slots.append(table[p // self.block_size] * self.block_size + p % self.block_size)
            self.lengths[seq] = start + n
            cu.append(cu[-1] + n)
            ctx.append(start + n)
        width = max(len(self.tables[s]) for s in new_tokens)
        bt = torch.full((len(ctx), width), -1, dtype=torch.int64)
        for i, seq in enumerate(new_tokens):
            bt[i, : len(self.tables[seq])] = torch.tensor(self.tables[seq])
        dev = self.device
        return Batch(tuple(cu), torch.cat(pos).to(dev), torch.cat(slots).to(dev), bt.to(dev), tuple(ctx), self.block_size)

    def schedule_decode(self, seqs: list[Hashable]) -> tuple[list[int], list[int], list[list[int]]]:
        """:meth:`schedule` of one new token per sequence, as plain ints for a CUDA-graph step's static buffers:
        (positions, cache slots, block tables); each sequence then attends to position + 1 keys."""
        bs, lengths, positions, slots, tables = self.block_size, self.lengths, [], [], []
        for seq in seqs:
            p = lengths.get(seq, 0)
            table = self.tables.get(seq)
            if table is None or p >= len(table) * bs:  # a new block (once every block_size steps)
                self._grow(seq, p + 1)
                table = self.tables[seq]
            positions.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            tables.append(table)
            lengths[seq] = p + 1
        return positions, slots, tables

    def reserve_block(self) -> int:
        """Take a free block for good (no sequence will get it): scratch room, e.g. for padding rows' keys."""
        if not self.free_blocks:
            raise RuntimeError("KV cache out of blocks: no block left to reserve")
        b = next(reversed(self.free_blocks))  # the last to be taken anyway
        if b in self.hash_of:
            del self.by_hash[self.hash_of.pop(b)]
        self._take(b)
        return b

    def release(self, seq: Hashable) -> None:
        """Give back a sequence's blocks; a block no other sequence uses is free (its tail first: the first
        to be evicted), and keeps its cached contents until it is taken again."""
        for b in reversed(self.tables.pop(seq)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_blocks[b] = None
        del self.lengths[seq]

    def write(self, layer: int, slots: torch.Tensor, values: Mapping[str, torch.Tensor]) -> None:
        store = self.layers[layer]
        if set(values) != set(store):
            raise ValueError(f"layer {layer} caches {sorted(store)}, got {sorted(values)}")
        for name, v in values.items():
            store[name][slots] = v.to(store[name].dtype)

    def read(self, layer: int, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: t[slots] for name, t in self.layers[layer].items()}
