"""Where a TP split cuts a tensor, and whether the cut respects its quantization blocks.

A column/row split is first computed in *weight space* (rows or input columns of the module's
weight, by heads where the rule says so), then carried to each tensor of the module:

* the weight itself and a column-parallel bias / per-head vector (GPT-OSS sinks): the same range;
* a row-parallel bias: replicated (added once after the all-reduce);
* a block scale: the range divided by the block along that dim.  The block comes from the scale
  dtype: float scales are 128x128 tiles (``weight_scale_inv``, DeepSeek / HF fine-grained FP8;
  compressed-tensors' FP8_BLOCK ``weight_scale``), U8 / E8M0 scales are 1x32 along K (MXFP8).
  A cut that is not a multiple of the block is refused: no rule makes half a tile.
* a one-element (per-tensor) scale: replicated.

KV heads: with n_kv < tp (tp a multiple of n_kv), tp rank t holds KV head t // (tp / n_kv), as
vLLM and SGLang replicate them.
"""

from __future__ import annotations

import math

from .layout import ShardError

Range = tuple[int, int]
FLOAT_SCALES = ("F32", "BF16", "F16", "F64")
E8M0_SCALES = ("U8", "F8_E8M0")
SCALE_PARAMS = ("weight_scale_inv", "weight_scale")


def scale_blocks(scale_dtype: str, name: str) -> tuple[int, int]:
    """Elements per scale entry along (rows, cols) for a 2-D block scale."""
    if scale_dtype in FLOAT_SCALES:
        return 128, 128
    if scale_dtype in E8M0_SCALES:
        return 1, 32
    raise ShardError(f"{name}: scale dtype {scale_dtype} is neither a float tile scale nor an E8M0 MX scale")


def check_scale_shape(name: str, shape: tuple[int, ...], weight: tuple[int, ...], blocks: tuple[int, int]) -> None:
    want = tuple(weight[:-2]) + (math.ceil(weight[-2] / blocks[0]), math.ceil(weight[-1] / blocks[1]))
    if blocks[1] == 32 and weight[-1] % 32:
        raise ShardError(f"{name}: weight K={weight[-1]} is not a multiple of 32 for an MX scale")
    if tuple(shape) != want:
        raise ShardError(f"{name}: scale shape {list(shape)} does not fit weight {list(weight)} in {blocks[0]}x{blocks[1]} blocks (expected {list(want)})")


def tp_ranges(size: int, tp: int, units: int | None, kv: bool) -> list[Range] | str:
    """Weight-space range per TP rank, or the reason the split is impossible."""
    n = units or size
    if units and size % units:
        return f"size {size} is not a multiple of its {units} heads"
    if kv and tp > n:
        if tp % n:
            return f"{n} KV heads cannot be replicated evenly over tp {tp}"
        per_head = size // n
        return [((t // (tp // n)) * per_head, (t // (tp // n) + 1) * per_head) for t in range(tp)]
    if n % tp:
        what = f"{n} heads" if units else f"{size}"
        return f"{what} / tp {tp} is not a whole number"
    piece = size // tp
    return [(t * piece, (t + 1) * piece) for t in range(tp)]


def misaligned(ranges: list[Range], block: int) -> int | None:
    """The first range length or start that cuts through a block, else None."""
    for a, b in ranges:
        if a % block or (b - a) % block:
            return b - a
    return None


def best_tp(size: int, tp: int, units: int | None, kv: bool, block: int, ep: int) -> int:
    """Largest TP below ``tp`` that divides EP and splits this tensor on block boundaries."""
    for t in range(tp - 1, 0, -1):
        r = tp_ranges(size, t, units, kv)
        if ep % t == 0 and not isinstance(r, str) and misaligned(r, block) is None:
            return t
    return 1


def split(name: str, *, label: str, size: int, units: int | None, kv: bool, tp: int, ep: int,
          block: int = 1, block_label: str = "") -> list[Range]:
    """Weight-space ranges of ``name``'s split dim per TP rank; a ShardError that says what works."""
    r = tp_ranges(size, tp, units, kv)
    if isinstance(r, str):
        raise ShardError(f"{name}: {label} {r}: {_hint(size, tp, units, kv, block, ep)}")
    bad = misaligned(r, block)
    if bad is not None:
        how = f"{size} / {units} KV heads = {bad} per rank" if kv and units and tp > units else f"{size} / tp {tp} = {bad}"
        raise ShardError(f"{name}: {label} {how} is not a multiple of {block} ({block_label}): {_hint(size, tp, units, kv, block, ep)}")
    return r


def _hint(size: int, tp: int, units: int | None, kv: bool, block: int, ep: int) -> str:
    best = best_tp(size, tp, units, kv, block, ep)
    return f"use --tp <= {best} (--ep {ep} still places the routed experts, which are never TP-split)"
