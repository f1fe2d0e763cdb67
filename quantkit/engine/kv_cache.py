"""Paged KV cache: fixed-size blocks of token slots, a block table per sequence.

Each attention layer declares what it stores per token (its ``cache_spec``): GQA layers
``k`` [n_kv, head_dim] and ``v`` [n_kv, v_dim]; DeepSeek MLA its compressed latent ``kv``
[kv_lora_rank] and the shared rotated key ``k_rot`` [qk_rope_head_dim] (as transformers and
DeepSeek cache them).  Storage per layer and name: [num_blocks * block_size, *shape] in the
model's compute dtype, so slot s of block b is row b * block_size + s.

:meth:`KVCache.schedule` is the interface a scheduler drives: it allocates blocks for the new
tokens of each sequence and returns the step's :class:`Batch` (positions continue each
sequence's length).  :meth:`release` returns a finished sequence's blocks.
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
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}

    def _grow(self, seq: Hashable, n_total: int) -> None:
        table = self.tables.setdefault(seq, [])
        need = -(-n_total // self.block_size) - len(table)
        if need > len(self.free_blocks):
            raise RuntimeError(f"KV cache out of blocks: sequence {seq!r} needs {need} more, {len(self.free_blocks)} free")
        table.extend(self.free_blocks.pop() for _ in range(need))

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

    def release(self, seq: Hashable) -> None:
        self.free_blocks.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def write(self, layer: int, slots: torch.Tensor, values: Mapping[str, torch.Tensor]) -> None:
        store = self.layers[layer]
        if set(values) != set(store):
            raise ValueError(f"layer {layer} caches {sorted(store)}, got {sorted(values)}")
        for name, v in values.items():
            store[name][slots] = v.to(store[name].dtype)

    def read(self, layer: int, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: t[slots] for name, t in self.layers[layer].items()}
