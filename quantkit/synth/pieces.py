"""Pieces: the units a synthetic checkpoint is generated in.

A :class:`Piece` knows the names, dtypes and shapes of the tensors it yields (so shards are
planned before any value exists) and makes them on demand, one piece at a time: a quantized
weight yields its weight and scale tensors together from one generated float32 stream.  Stored
formats come from :mod:`quantkit.formats` (``fp8_block.quantize_weight``, ``mxfp4.encode``).

Layouts written here:
  BF16 linear            ``name`` BF16 [out, in]
  FP8 block (DeepSeek)   ``name`` F8_E4M3 [out, in] + ``name_scale_inv`` F32 [ceil(out/128), ceil(in/128)]
  MXFP4 experts (GPT-OSS)  ``blocks`` U8 [E, out, in/32, 16] + ``scales`` U8 [E, out, in/32]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from ..writer import TensorSpec
from ..formats import fp8_block, mxfp4
from . import weights
from .tokenizer import TokenizerSpec


@dataclass(frozen=True)
class Piece:
    specs: tuple[TensorSpec, ...]
    make: Callable[[], tuple[torch.Tensor, ...]]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def tensor(name: str, dtype: torch.dtype, shape: tuple[int, ...], fn: Callable[[], torch.Tensor]) -> Piece:
    """One small tensor computed by ``fn`` (float32) and cast to ``dtype``."""
    return Piece((TensorSpec(name, dtype, shape),), lambda: (fn().to(dtype).reshape(shape),))


def norm(seed: int, name: str, n: int, dtype: torch.dtype = torch.bfloat16, key: str | None = None) -> Piece:
    return tensor(name, dtype, (n,), lambda: weights.norm(seed, key or name, n))


def normal(seed: int, name: str, shape: tuple[int, ...], std: float, dtype: torch.dtype = torch.bfloat16, key: str | None = None) -> Piece:
    return tensor(name, dtype, shape, lambda: weights.normal(seed, key or name, shape, std))


def bf16_rows(seed: int, name: str, parts: Sequence[tuple[str, int]], cols: int, std: float) -> Piece:
    """BF16 [sum(rows), cols]: the weights named ``parts`` (key, rows) stacked along rows (key = seed name)."""
    rows = sum(r for _, r in parts)

    def make() -> tuple[torch.Tensor, ...]:
        out = torch.empty(rows, cols, dtype=torch.bfloat16)  # [out, in]
        jobs, base = [], 0
        for key, n in parts:
            jobs += weights.linear(seed, key, n, cols, std, partial(_put_rows, out, base))
            base += n
        weights.run(jobs)
        return (out,)

    return Piece((TensorSpec(name, torch.bfloat16, (rows, cols)),), make)


def _put_rows(out: torch.Tensor, base: int, r0: int, z: torch.Tensor) -> None:
    out[base + r0 : base + r0 + z.shape[0]] = z


def bf16_linear(seed: int, name: str, rows: int, cols: int, std: float, key: str | None = None) -> Piece:
    return bf16_rows(seed, name, [(key or name, rows)], cols, std)


def fp8_linear(seed: int, name: str, rows: int, cols: int, std: float, scale_fmt: str) -> Piece:
    """``name`` F8_E4M3 [rows, cols] + ``name_scale_inv`` F32 tile scales (DeepSeek fine-grained FP8)."""
    grid = (_ceil(rows, fp8_block.BLOCK), _ceil(cols, fp8_block.BLOCK))

    def make() -> tuple[torch.Tensor, ...]:
        q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
        s = torch.empty(grid, dtype=torch.float32)

        def put(r0: int, z: torch.Tensor) -> None:
            qc, sc = fp8_block.quantize_weight(z, scale_fmt=scale_fmt)
            q[r0 : r0 + z.shape[0]] = qc
            t0 = r0 // fp8_block.BLOCK  # chunks start on tile rows (weights.row_chunks)
            s[t0 : t0 + sc.shape[0]] = sc

        weights.run(weights.linear(seed, name, rows, cols, std, put))
        return q, s

    specs = (TensorSpec(name, torch.float8_e4m3fn, (rows, cols)), TensorSpec(name + "_scale_inv", torch.float32, grid))
    return Piece(specs, make)


def mxfp4_experts(seed: int, blocks: str, scales: str, key: str, experts: int, rows: int, cols: int, std: float) -> Piece:
    """GPT-OSS stacked experts [E, rows, cols] as MXFP4 ``blocks`` + ``scales`` (E8M0 bytes); expert e seeded by ``key[e]``."""
    if cols % mxfp4.BLOCK:
        raise ValueError(f"{blocks}: MXFP4 needs the input dim to be a multiple of {mxfp4.BLOCK}, got {cols}")
    g = cols // mxfp4.BLOCK

    def make() -> tuple[torch.Tensor, ...]:
        b = torch.empty(experts, rows, g, mxfp4.BLOCK // 2, dtype=torch.uint8)
        s = torch.empty(experts, rows, g, dtype=torch.uint8)

        def put(e: int, r0: int, z: torch.Tensor) -> None:
            bc, sc = mxfp4.encode(z)
            b[e, r0 : r0 + z.shape[0]] = bc
            s[e, r0 : r0 + z.shape[0]] = sc

        weights.run([job for e in range(experts) for job in weights.linear(seed, f"{key}[{e}]", rows, cols, std, partial(put, e))])
        return b, s

    specs = (
        TensorSpec(blocks, torch.uint8, (experts, rows, g, mxfp4.BLOCK // 2)),
        TensorSpec(scales, torch.uint8, (experts, rows, g)),
    )
    return Piece(specs, make)


@dataclass
class Synth:
    """Everything a synthetic checkpoint is made of, before any value is generated."""

    config: dict  # config.json
    generation_config: dict
    pieces: list[Piece]
    tokenizer: TokenizerSpec
    weights_dir: str = ""  # "original" for GPT-OSS's original layout
    extra: dict[str, dict] = field(default_factory=dict)  # path relative to DST -> JSON (original/config.json, ...)

    @property
    def specs(self) -> list[TensorSpec]:
        return [s for p in self.pieces for s in p.specs]
