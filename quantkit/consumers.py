"""Where a known consumer will refuse a checkpoint that is valid here: warnings for ``inspect``.

Each rule names the consumer, the version it was checked with, and the error that consumer gives,
as measured on quantkit's own outputs (``tests/test_consumers.py`` loads them to keep that true):

* transformers 5.24 dequantizes fine-grained FP8 on load (CPU) only when every 128x128 tile is
  whole: a weight whose N or K is not a multiple of 128 raises "Weight shape (320, 192) not
  divisible by scale grid (3, 2)".  DeepSeek's rule (zero-pad the tile, then cut), which quantkit
  follows, reads them.
* transformers 5.24 fuses a MoE's per-expert weights into [E, ...] parameters on load; its
  compressed-tensors dequantizer then multiplies the fused weight by per-expert scales that do not
  line up ("The size of tensor a (256) must match the size of tensor b (8)"), so it cannot load a
  compressed-tensors checkpoint whose routed experts are quantized (Qwen3-MoE, DeepSeek-V3).
  GPT-OSS's fused expert names with F8 weights are quantkit's own (no ecosystem convention exists):
  transformers refuses them too.  quantkit's engine reads all of these.
"""

from __future__ import annotations

import re

from . import families
from .checkpoint import Checkpoint, TensorInfo

TRANSFORMERS = "transformers 5.24"
TILE = 128
EXPERT = re.compile(r"\.mlp\.experts\.")


def _partial_tiles(fp8_block: list[TensorInfo]) -> list[str]:
    ragged = [t for t in fp8_block if t.shape[-1] % TILE or t.shape[-2] % TILE]
    if not ragged:
        return []
    t = ragged[0]
    n, k = t.shape[-2:]
    grid = (-(-n // TILE), -(-k // TILE))
    return [f"{TRANSFORMERS} will refuse to load this checkpoint: {len(ragged)} fp8-block weight(s) have partial 128x128 "
            f"tiles, e.g. {t.name} {list(t.shape)} (its FP8 dequantizer raises \"Weight shape ({n}, {k}) not divisible by "
            f"scale grid ({grid[0]}, {grid[1]})\"); quantkit reads them by DeepSeek's zero-padding rule"]


def _ct_experts(ck: Checkpoint, family: str | None) -> list[str]:
    q = ck.config.get("quantization_config") or {}
    if q.get("quant_method") != "compressed-tensors":
        return []
    quantized = [n for n, t in ck.tensors.items() if EXPERT.search(n) and (t.dtype == "F8_E4M3" or n.endswith(".weight_packed"))]
    if not quantized:
        return []
    if family is not None and families.get(family).fused_experts:
        why = "the fused GPT-OSS expert names with F8 weights are quantkit's own (no ecosystem convention exists)"
    else:
        why = ("it fuses the per-expert weights into [E, ...] tensors and its compressed-tensors dequantizer does not fit "
               "their scales (\"The size of tensor a (...) must match the size of tensor b (...)\")")
    return [f"{TRANSFORMERS} will refuse to load this compressed-tensors MoE checkpoint ({len(quantized)} quantized expert "
            f"tensors, e.g. {quantized[0]}): {why}; quantkit's engine reads it"]


def warnings(ck: Checkpoint, family: str | None, formats: dict[str, list[TensorInfo]]) -> list[str]:
    """Warnings for ``ck``; ``formats`` maps each weight format to its weight tensors."""
    blocks = formats.get("fp8-block", []) + formats.get("fp8-block-ue8m0", [])
    return _partial_tiles(blocks) + _ct_experts(ck, family)
