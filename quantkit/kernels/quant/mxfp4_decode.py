"""Triton MXFP4 decode: GPT-OSS ``*_blocks`` U8 [..., out, G, 16] + ``*_scales`` U8 [..., out, G]
-> [..., out, G*32] (out x in, as the gpt-oss reference keeps it), float32/bfloat16/float16.

Layout (transformers integrations/mxfp4.py, openai/gpt-oss torch/weights.py): each byte holds
element 2j in its LOW nibble and 2j+1 in its HIGH nibble; one E8M0 scale per 32 elements along
the input dim.  Flattened, the blocks are [NB, 16] bytes, the scales [NB] and the output
[NB, 32]: one MX block per row, whatever the leading (expert, out) dims.

Numerics of :func:`formats.mxfp4.decode`: the E2M1 value is built from its code's bits
(bit 3 sign, bits 2-1 exponent, bit 0 mantissa; exponent 0 is 0 or 0.5), multiplied in float32
by 2**(scale-127) (exact, or the same overflow/NaN as the reference), then cast to the output
dtype with round-to-nearest-even.  Every product has at most two significant bits and lies in
bfloat16's range (2**-128 .. 6 * 2**127, else inf), so for bfloat16 output the cast is exactly
the top 16 bits of the float32; the kernel stores those bits (the interpreter's float32 ->
bfloat16 cast mishandles float32 subnormals, which scale byte 0 produces).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..triton_numerics import PRIORITY, available, cdiv, e8m0_decode

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# launch configurations scripts/bench_formats.py sweeps (the first is the default); all give the same bytes
TUNING: tuple[dict[str, int], ...] = (
    {"block_n": 128, "num_warps": 4},
    {"block_n": 64, "num_warps": 4},
    {"block_n": 256, "num_warps": 4},
    {"block_n": 256, "num_warps": 8},
    {"block_n": 512, "num_warps": 8},
)


@triton.jit
def e2m1_value(c):
    """int32 E2M1 code 0..15 -> float32 value (formats.mxfp4.FP4_VALUES[c])."""
    e = (c >> 1) & 3
    m = c & 1
    mag = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))  # 0 / 0.5, or 2**(e-1) * 1.m
    return (mag | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_decode_kernel(blocks_ptr, scales_ptr, out_ptr, n_blocks, BLOCK_N: tl.constexpr, BF16_BITS: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK_N  # first MX block of this program (int64 base;
    blocks_ptr += first * 16  # the offsets inside the tile stay int32)
    scales_ptr += first
    out_ptr += first * 32
    r = tl.arange(0, BLOCK_N)
    rmask = r < n_blocks - first
    packed = tl.load(blocks_ptr + r[:, None] * 16 + tl.arange(0, 16)[None, :], mask=rmask[:, None], other=0).to(tl.int32)
    codes = tl.interleave(packed & 0xF, packed >> 4)  # [BLOCK_N, 32]: element 2j = low nibble
    scale = e8m0_decode(tl.load(scales_ptr + r, mask=rmask, other=127).to(tl.int32))
    out = e2m1_value(codes) * scale[:, None]
    if BF16_BITS:  # out_ptr is the bfloat16 output viewed as int16
        out = (out.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
    else:
        out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + r[:, None] * 32 + tl.arange(0, 32)[None, :], out, mask=rmask[:, None])


@dispatch.backend("mxfp4_decode", "triton", available=available, priority=PRIORITY)
def mxfp4_decode(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32, *, block_n: int = 128, num_warps: int = 4
) -> torch.Tensor:
    """GPT-OSS blocks [..., out, G, 16] + scales [..., out, G] -> [..., out, G*32] ``dtype``."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match [..., G, 16] / [..., G]")
    scales = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    assert blocks.dtype == torch.uint8, f"mxfp4 blocks must be uint8, got {blocks.dtype}"
    assert blocks.is_contiguous() and scales.is_contiguous(), "mxfp4 decode: blocks and scales must be contiguous"
    assert blocks.device == scales.device, f"blocks on {blocks.device}, scales on {scales.device}"
    assert dtype in OUT_DTYPES, f"mxfp4 decode writes {OUT_DTYPES}, not {dtype}"
    out = torch.empty((*blocks.shape[:-2], blocks.shape[-2] * 32), dtype=dtype, device=blocks.device)  # [..., out, in]
    n_blocks = scales.numel()
    if n_blocks:
        bf16 = dtype == torch.bfloat16
        dst = out.view(torch.int16) if bf16 else out
        grid = (cdiv(n_blocks, block_n),)
        _mxfp4_decode_kernel[grid](blocks, scales, dst, n_blocks, BLOCK_N=block_n, BF16_BITS=bf16, num_warps=num_warps)
    return out
