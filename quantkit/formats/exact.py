"""Conversions that are exact: no element is rounded, so ``--rounding`` does not apply.

* MXFP4 -> MXFP8: every E2M1 value (0, .5, 1, 1.5, 2, 3, 4, 6) is an E4M3 value, so the same
  E8M0 scale with the element re-encoded as E4M3 represents the same numbers.
* power-of-two FP8-block -> MXFP8: a 128x128 tile with scale 2**k becomes 128 x 4 MX blocks,
  each with the E8M0 byte k + 127 and the same E4M3 bytes.
* FP8-block -> FP8-block with the same scale format: the tensors are copied.
* MXFP8 -> FP8-block, tile by tile: a 128x128 tile holds 128 x 4 MX blocks with scales 2**k_ij.
  With the tile scale S = 2**max(k_ij), each element q * 2**k_ij becomes q * 2**(k_ij - max k),
  exact when that is still an E4M3 value (a smaller exponent may push it into the subnormals and
  cut mantissa bits, or below 2**-9).  :func:`mxfp8_to_fp8_block` says which tiles are exact.
* MXFP8 -> BF16: every E4M3 x 2**k value is a BF16 value (but for results below BF16's
  smallest subnormal, 2**-133, which the conversion's verification would report).

:func:`lossless_path` tells, per tensor, whether one exists.
"""

from __future__ import annotations

import torch

from . import e8m0, fp8_block, mxfp4
from .fp8 import E4M3_MAX


def mxfp4_to_mxfp8(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-OSS blocks [..., out, G, 16] + scales [..., out, G] -> (E4M3 [..., out, G*32], U8 [..., out, G])."""
    vals = mxfp4.lut(blocks.device)[mxfp4.unpack(blocks).long()].flatten(-2)
    return vals.to(torch.float8_e4m3fn), scales.view(torch.uint8).clone()


def fp8_block_pow2_to_mxfp8(q: torch.Tensor, scale_inv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 [..., N, K] + power-of-two F32 tile scales -> (same E4M3 bytes, U8 [..., N, K/32])."""
    n, k = q.shape[-2:]
    if k % 32:
        raise ValueError(f"K={k} is not a multiple of 32: no MXFP8 layout exists")
    if not fp8_block.is_pow2_scale(scale_inv):
        raise ValueError("scales are not all powers of two: FP8-block -> MXFP8 is not exact")
    s = scale_inv.to(torch.float32)
    k_exp = torch.frexp(s)[1].to(torch.int32) - 1 + e8m0.BIAS  # s = 2**(byte-127), subnormals too
    per_col = k_exp.repeat_interleave(fp8_block.BLOCK, -2)[..., :n, :]
    per_blk = per_col.repeat_interleave(fp8_block.BLOCK // 32, -1)[..., : k // 32]
    return q.clone(), per_blk.to(torch.uint8)


def mxfp8_to_fp8_block(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXFP8 [N, K] E4M3 + U8 E8M0 [N, K/32] -> (E4M3 [N, K], F32 power-of-two tile scales
    [ceil(N/128), ceil(K/128)], bool [ceil(N/128), ceil(K/128)]: the tile is exact).

    Codes and scales of tiles that are not exact are not meaningful: requantize those."""
    n, k = q.shape
    e = scales.view(torch.uint8).to(torch.int32)  # [N, K/32]
    per = fp8_block.BLOCK // 32
    pe = torch.nn.functional.pad(e, (0, (-e.shape[1]) % per, 0, (-n) % fp8_block.BLOCK))  # byte 0 never wins a max
    kmax = pe.unflatten(1, (-1, per)).unflatten(0, (-1, fp8_block.BLOCK)).amax(dim=(1, 3))  # [tn, tk]
    s = e8m0.pow2(kmax - e8m0.BIAS)
    x = q.to(torch.float32).unflatten(-1, (-1, 32)) * e8m0.decode(scales).unsqueeze(-1)  # the MXFP8 values
    x = x.flatten(-2)
    full = fp8_block.expand_tiles(s, n, k)
    out = (x / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)  # |x| <= 448 * S: nothing clips
    # exact: the tile's dequantization (DeepSeek's rule, q * S) gives back every value
    changed = (out.to(torch.float32) * full != x).to(torch.float32)
    return out, s, fp8_block.tile_amax(changed) == 0


def lossless_path(src: str, dst: str, *, pow2_scales: bool = False, k: int | None = None, same_scale_fmt: bool = True) -> str | None:
    """Name of the exact path from format ``src`` to ``dst`` for one tensor, or None.

    Formats are named as ``convert --to`` names them: mxfp4, fp8-block, mxfp8, bf16.
    """
    if k is not None and dst == "mxfp8" and k % 32:
        return None
    if src == "mxfp4" and dst == "mxfp8":
        return "mxfp4->mxfp8"
    if src == "fp8-block" and dst == "mxfp8" and pow2_scales:
        return "fp8-block(ue8m0)->mxfp8"
    if src == dst and src in ("fp8-block", "mxfp8") and same_scale_fmt:
        return "copy"
    if src == dst == "bf16":
        return "copy"
    return None

