"""Launch configurations of the Triton attention kernels, as data: the first matching row wins.  Compiled rows were
measured on the H200 (quantkit bench attention, sweep-decode) and serve every CUDA device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def name(self) -> str:
        return f"{self.block_m}x{self.block_n}/w{self.num_warps}/st{self.num_stages}"

    __str__ = name


@dataclass(frozen=True)
class DecodeConfig:
    """``num_splits`` 0: :func:`.select.kv_splits`."""

    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int = 0
    programs_per_sm: int = 4
    max_splits: int = 128
    pdl: bool = True  # programmatic dependent launches where they exist (sm_90+)

    def name(self) -> str:
        return f"n{self.block_n}/w{self.num_warps}/st{self.num_stages}/s{self.num_splits or 'auto'}" + ("/pdl" if self.pdl else "")

    __str__ = name


@dataclass(frozen=True)
class Row:
    """``config`` for kernels run ``where``, head dim <= ``max_d``, ``dtype`` (None: any)."""

    where: str
    config: PrefillConfig | DecodeConfig
    reason: str
    max_d: int | None = None
    dtype: torch.dtype | None = None

    def matches(self, where: str, d: int, dtype: torch.dtype) -> bool:
        return self.where == where and (self.max_d is None or d <= self.max_d) and (self.dtype is None or dtype == self.dtype)


INTERPRETER = "the CPU interpreter: the smallest tiles tl.dot takes"

PREFILL = (
    Row("interpreter", PrefillConfig(16, 16, 1, 1), INTERPRETER),
    Row("compiled", PrefillConfig(64, 64, 4, 3), "d <= 64: best of 13 tiles at GPT-OSS size, 1.37 ms vs 1.52 for 128x64 (8192 tokens)", 64),
    Row("compiled", PrefillConfig(64, 32, 4, 2), "float32, d > 64: 128x64 tiles need 361 KB of shared memory, an H200 block 227 KB",
        dtype=torch.float32),
    Row("compiled", PrefillConfig(128, 64, 8, 3), "d > 64 (Qwen3's 128, MLA's 192): 128-query tiles, 8 warps (not swept)"),
)

DECODE = (
    Row("interpreter", DecodeConfig(16, 1, 1), INTERPRETER),
    Row("compiled", DecodeConfig(), "128-key blocks, 2 stages: the best of 6 tiles x 17 split counts swept at GPT-OSS size; "
        "dependent launches 1.05-1.19x at B <= 8, the same bytes"),
)


def first(table: tuple[Row, ...], where: str, d: int, dtype: torch.dtype) -> Row:
    for row in table:
        if row.matches(where, d, dtype):
            return row
    raise LookupError(f"no launch configuration for {where} kernels, head dim {d}, {dtype}")
