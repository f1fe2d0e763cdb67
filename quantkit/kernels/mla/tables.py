"""MLA decode's launch configurations and FlashInfer's reach, as data (rows as :mod:`..attention.tables`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.tables import INTERPRETER, Row


@dataclass(frozen=True)
class MLAConfig:
    block_h: int = 64  # heads per program: the M of both dots, >= 16 for tensor cores
    block_n: int = 64  # tokens per latent chunk
    num_warps: int = 8
    num_stages: int = 2
    num_splits: int = 0  # 0: kv_splits with SPLITS

    def name(self) -> str:
        return f"h{self.block_h}/n{self.block_n}/w{self.num_warps}/st{self.num_stages}/s{self.num_splits or 'auto'}"

    __str__ = name


MLA = (
    Row("interpreter", MLAConfig(16, 16, 1, 1), INTERPRETER),
    Row("compiled", MLAConfig(), "fastest of quantkit bench mla's sweep at DeepSeek-V3 size: 2.58 ms vs 6.30 for h16/n32/w4 (B 128, ctx 16384), "
        "though it spills some registers"),
)
SPLITS = {"programs_per_sm": 0, "max_splits": 64}  # at least two programs per SM, rounded up

FLASHINFER_DIMS = (512, 64)  # (rank, rope) FlashInfer 0.5's MLA kernels are built for
FLASHINFER_DTYPES = (torch.bfloat16,)  # checked on the H200
FLASHINFER_WHY = "FlashInfer's MLA planned once per step: 2.1-2.3 TB/s at B >= 16, Triton 0.41-0.95 TB/s"
