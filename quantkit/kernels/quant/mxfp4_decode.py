"""Triton MXFP4 decode: GPT-OSS ``*_blocks`` U8 [..., out, G, 16] + ``*_scales`` U8 [..., out, G] -> [..., out, G*32].

Element 2j in a byte's low nibble, 2j+1 in its high one; one E8M0 scale per 32 inputs (openai/gpt-oss).  Bit for
bit with :func:`formats.mxfp4.decode`: value times 2**(scale-127) in float32, cast RNE.  A product has at most two
significant bits, so its bfloat16 is the float32's top 16 bits, which the kernel stores: the interpreter's cast
mishandles the subnormals scale byte 0 gives.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..triton_numerics import PRIORITY, available, cdiv, e8m0_decode

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Launch configs that quantkit bench formats --sweep times, row 0 the default; all give the same bytes.
TUNING: tuple[dict[str, int], ...] = (
    {"block_n": 128, "num_warps": 4},  # default: 128 MX blocks (4096 outputs) a program
    {"block_n": 64, "num_warps": 4},  # more programs
    {"block_n": 256, "num_warps": 4},  # fewer programs
    {"block_n": 256, "num_warps": 8},  # fewer programs, more warps
    {"block_n": 512, "num_warps": 8},  # fewest programs
)


@triton.jit
def e2m1_value(c):
    """int32 E2M1 code -> float32 value (formats.mxfp4.FP4_VALUES[c])."""
    e = (c >> 1) & 3
    m = c & 1
    mag = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))  # 0 or 0.5; 2**(e-1) * 1.m
    return (mag | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_decode_kernel(blocks_ptr, scales_ptr, out_ptr, n_blocks, BLOCK_N: tl.constexpr, BF16_BITS: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK_N  # int64; offsets inside the tile stay int32
    blocks_ptr += first * 16
    scales_ptr += first
    out_ptr += first * 32
    r = tl.arange(0, BLOCK_N)
    rmask = r < n_blocks - first
    packed = tl.load(blocks_ptr + r[:, None] * 16 + tl.arange(0, 16)[None, :], mask=rmask[:, None], other=0).to(tl.int32)
    codes = tl.interleave(packed & 0xF, packed >> 4)  # [BLOCK_N, 32]
    scale = e8m0_decode(tl.load(scales_ptr + r, mask=rmask, other=127).to(tl.int32))
    out = e2m1_value(codes) * scale[:, None]
    if BF16_BITS:  # out_ptr: the bfloat16 output as int16
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
