"""``fused_moe`` tuning tables: per device kind and format, rows keyed by average (token, slot) pairs per expert,
each with its measurement (graph-timed, L2 flushed, same output bytes).  MX block-diagonal rows keep their dots on
mma.sync (tiles under 64 rows or under 4 warps), which sums in float32; wgmma's ~14-bit sums flip E4M3 codes of
the re-quantized intermediate.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_K = 128


@dataclass(frozen=True)
class MoeConfig:
    """Tiles of both GEMMs (one ``block_m``); ``block_n1`` counts intermediate columns."""

    block_m: int
    block_n1: int
    block_n2: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    upcast: bool = False  # MX experts: exact bf16 operands instead of per-32 promoted fp8 dots
    waves: int = 1  # K is split until busy programs give every SM this many
    sorted_rows: bool = False  # rows put in expert order once (:mod:`.sorted_tokens`)
    mx_step: int = 32  # sorted rows, MX experts: K columns per step (32 / 64 / 128)
    wgmma: bool = False  # sorted rows on the warp-specialised Gluon kernel (FP8-block, sm_90)
    diag: bool = False  # gathered rows, MX: one block-diagonal fp8 dot per 128 columns
    block_k: int = BLOCK_K  # gathered rows, FP8-block: K columns per step, 128 or 256
    pdl: bool = False  # gathered rows: launches as programmatic dependents (compiled sm_90+)

    def name(self) -> str:
        flags = "/up" if self.upcast else ""
        flags += f"/waves{self.waves}" if self.waves != 1 else ""
        flags += "/sorted" if self.sorted_rows else ""
        flags += f"/k{self.mx_step}" if self.mx_step != 32 else ""
        flags += "/wgmma" if self.wgmma else ""
        flags += "/diag" if self.diag else ""
        flags += f"/bk{self.block_k}" if self.block_k != BLOCK_K else ""
        flags += "/pdl" if self.pdl else ""
        return f"{self.block_m}x{self.block_n1}/{self.block_n2}/w{self.num_warps}/st{self.num_stages}{flags}"

    __str__ = name


@dataclass(frozen=True)
class Row:
    max_pairs: float  # the most average (token, slot) pairs per expert it serves
    config: MoeConfig
    reason: str


INF = float("inf")
H200 = {
    "fp8-block": (
        Row(1 / 32, MoeConfig(16, 32, 64, num_stages=4, pdl=True),
            "one token: 16-row blocks and narrow tiles spread 4-8 hit experts over every SM; 256-column K steps 0.94x here"),
        Row(0.5, MoeConfig(16, 32, 64, block_k=256, pdl=True),
            "few tokens: 256-column K steps keep twice the weight bytes in flight, 1.03-1.12x at T = 4-16"),
        Row(16, MoeConfig(16, 64, 64, block_k=256),
            "to 16 pairs per expert: 16-row blocks with 256-column steps, 1.01-1.07x the 32-row blocks"),
        Row(48, MoeConfig(64, 64, 64, num_stages=4, pdl=True),
            "to 48 pairs per expert: 64-row blocks read each expert's weight once, 1.13x the 32-row blocks"),
        Row(160, MoeConfig(64, 64, 128),
            "to 160 pairs per expert: compute bound, 64-row blocks and 128-column GEMM-2 tiles"),
        Row(INF, MoeConfig(64, 64, 128, num_stages=4, sorted_rows=True, wgmma=True),
            "prefill: expert-sorted rows on the warp-specialised wgmma kernel, 1.08-1.18x the Triton sorted tiles"),
    ),
    "mxfp8": (
        Row(2, MoeConfig(4, 32, 64, num_warps=2, waves=4, diag=True, pdl=True),
            "to 2 pairs per expert: block-diagonal fp8 dots on 4-row blocks, K split for 4 programs per SM, 1.5-1.7x"),
        Row(16, MoeConfig(8, 64, 64, num_warps=2, diag=True, pdl=True),
            "to 16 pairs per expert: block-diagonal fp8 dots on 8-row blocks, 1.1-1.5x the per-32 dots"),
        Row(48, MoeConfig(32, 64, 64, num_stages=4),
            "to 48 pairs per expert: 32-row blocks of per-32 promoted dots; block-diagonal dots 0.92-0.98x here"),
        Row(160, MoeConfig(64, 64, 128, upcast=True),
            "to 160 pairs per expert: on 64-row blocks exact bf16 operands cost less than per-32 promotion"),
        Row(INF, MoeConfig(64, 64, 128, num_stages=4, upcast=True, sorted_rows=True),
            "prefill: expert-sorted rows with bf16 operands, 1.33-1.50x gathered rows"),
    ),
}
TABLES = {(9, 0): H200}  # compute capability -> rows

# FP8-block prefill without the wgmma kernel: sorted rows on Triton tiles, 1.11-1.30x gathered rows
PREFILL_TILED = MoeConfig(64, 64, 128, num_stages=4, sorted_rows=True)
# MX prefill, concatenated gate/up: 64-column steps upcast the activations once for both dots (1.07x; interleaved 0.96x)
MX_STEP_CONCAT = 64

# (name, experts, top-k, hidden, intermediate, interleaved gate/up): the models of the kernel map
MAP_MODELS = (
    ("gpt-oss-20b", 32, 4, 2880, 2880, True),
    ("qwen3-30b-a3b", 128, 8, 2048, 768, False),
    ("deepseek-v3", 256, 8, 7168, 2048, False),
)
MAP_TOKENS = (1, 8, 32, 64, 128, 256, 1024, 8192)


def rows(capability: tuple[int, int], fmt: str) -> tuple[Row, ...]:
    """A device kind's rows; kinds without a table run the H200's, the only one measured."""
    table = TABLES.get(capability, H200)
    if fmt not in table:
        raise ValueError(f"fused_moe: no Triton tiles for {fmt} experts; tables exist for {', '.join(table)}")
    return table[fmt]


def lookup(capability: tuple[int, int], fmt: str, pairs_per_expert: float) -> Row:
    return next(r for r in rows(capability, fmt) if pairs_per_expert <= r.max_pairs)
