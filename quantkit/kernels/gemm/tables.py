"""Tuning tables of the GEMM ops, one per device kind, measured on the H200 with ``quantkit bench kernels``.

:mod:`.select` runs the first :class:`Row` whose M and K ranges hold the call and whose kernel can run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .block_scaled import INT32_LIMIT, Config
from .skinny import SkinnyConfig
from .wgmma import WgmmaConfig


@dataclass(frozen=True)
class Row:
    """Up to M = ``m_max`` rows, for K in [``k_min``, ``k_max``]: run ``kernel`` (a leaf name) with ``config``."""

    m_max: int
    kernel: str
    config: Any
    reason: str
    k_min: int = 0
    k_max: int = INT32_LIMIT


SMALL_M = SkinnyConfig(block_n=64, waves=2, num_warps=4, num_stages=4, unsplit_kb=16)
TILED_MID = Config(64, 128, group=8, num_warps=4, num_stages=4)
TILED_LARGE = Config(128, 128, group=8, tma=True, num_warps=8, num_stages=4)

# every device
FP8_BLOCK_ANY: tuple[Row, ...] = (
    Row(64, "triton.skinny", SMALL_M, "small M is weight-bandwidth bound: split-K over 2 programs per SM streams the weight once; "
        "K <= 2048 is not split (the reduction costs about 2 us a call)"),
    Row(512, "triton.tiled", TILED_MID, "64x128 tiles on one warpgroup keep every SM busy up to M = 512"),
    Row(INT32_LIMIT, "triton.tiled", TILED_LARGE, "128x128 tiles on two warpgroups, 4 TMA stages: fastest tiled config at M >= 1024"),
)

# sm_90 (the H200): DeepGEMM and the wgmma kernel where they win, then the rows of every device
FP8_BLOCK_SM90: tuple[Row, ...] = (
    Row(24, "triton.skinny", SMALL_M, "the small-M kernel beats DeepGEMM and cuBLAS on every served shape up to M = 24"),
    Row(32, "deepgemm", None, "DeepGEMM's 64-row tiles win at M = 25-32 where K <= 4096", k_max=4096),
    Row(32, "triton.skinny", SMALL_M, "on a K > 4096 the small-M kernel, which splits K over every SM, wins"),
    Row(64, "deepgemm", None, "DeepGEMM wins at M = 33-64 on every served shape (1.1-1.5x the wgmma kernel)"),
    Row(64, "triton.wgmma", WgmmaConfig(stages=5, unroll=4), "wgmma, one 128x128 tile per program, beats the small-M kernel from M = 33"),
    Row(512, "deepgemm", None, "DeepGEMM wins at M = 65-512 where K >= 1024 (on kv_b's K = 512 the wgmma kernel does)", k_min=1024),
    Row(256, "triton.wgmma", WgmmaConfig(stages=8, unroll=4, split_k=0, block_n=0),
        "narrow tiles and split-K where few 128x128 tiles would leave SMs idle; 8 stages hide the loads"),
    Row(INT32_LIMIT, "triton.wgmma", WgmmaConfig(stages=5, unroll=4), "warp-specialised wgmma matches prepared cuBLAS from M = 65 on"),
    *FP8_BLOCK_ANY,
)

# MXFP8 on every device (Hopper has no MX tensor cores)
MXFP8_ANY: tuple[Row, ...] = (
    Row(32, "triton.skinny", SkinnyConfig(block_n=64, waves=2, num_warps=4, num_stages=4),
        "one block-diagonal fp8 dot per 128 columns: 4-row token tiles, a quarter of the promotion work at M <= 4"),
    Row(64, "triton.skinny", SkinnyConfig(block_n=64, waves=2, upcast=True, num_warps=4, num_stages=4),
        "at M = 33-64 the block-diagonal product grows to [64, 256] a step: exact bf16 operands, one dot per 128 columns"),
    Row(INT32_LIMIT, "dequant-bf16", None, "from M = 65 dequantizing both operands to bf16 (exact) for one cuBLAS GEMM is about 2x "
        "the emulation; it holds a bf16 copy of the weight for the call"),
    Row(512, "triton.tiled", Config(64, 128, upcast=True, num_warps=4, num_stages=3),
        "upcast tiles: per-32 promotion stalls the tensor core after every 32-deep dot"),
    Row(INT32_LIMIT, "triton.tiled", Config(128, 128, upcast=True, tma=True, num_warps=8, num_stages=3),
        "128x128 upcast tiles on two warpgroups from M = 513"),
)

FP8_BLOCK = {"sm90": FP8_BLOCK_SM90, "any": FP8_BLOCK_ANY}
MXFP8 = {"any": MXFP8_ANY}


def rows(m: int, k: int, table: tuple[Row, ...]) -> list[Row]:
    """The rows that hold (M, K), in table order."""
    return [r for r in table if m <= r.m_max and r.k_min <= k <= r.k_max]
