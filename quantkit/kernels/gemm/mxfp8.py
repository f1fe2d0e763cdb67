"""MXFP8 GEMM on Hopper, which has no MX tensor-core path (SM90): three ways to compute the same function.

Numerics (the spec, :mod:`quantkit.formats.mxfp8`): y = dequant(A) @ dequant(W).T (+ bias) in
float32, A E4M3 [M, K] with U8 E8M0 scales [M, K/32] (dynamic 1x32 activations), W E4M3 [N, K]
with U8 E8M0 scales [N, K/32] (compressed-tensors ``weight_scale``).  K % 32 == 0.

1. Emulation (:func:`gemm_mxfp8`): the block-scaled kernels of :mod:`.gemm_skinny` (M <= 64) and
   :mod:`.gemm_block_scaled` with 32-column sub-blocks.  ``promote`` takes one fp8 tensor-core
   dot per 32 columns and promotes it into the float32 accumulator times 2**(ea + ew); the small-M
   kernel gets the four 32-column products of a 128-column step from one dot on a block-diagonal
   activation tile (``diag``); ``upcast`` multiplies the E4M3 tiles by their power-of-two scales in
   bf16 (exact) and runs a bf16 dot.
2. Requantized weight (:func:`requant_weight_128`, then :func:`gemm_mxfp8_w128`): at load, each
   128x128 weight tile is re-expressed with one power-of-two scale, the largest of its blocks,
   when that is exact (every element shifted down stays an E4M3 value: always true for MXFP8
   made from a power-of-two FP8-block checkpoint, rarely for others; otherwise it raises).  The
   GEMM then promotes per 32 on the activation side only, with a scalar weight scale per tile.
3. Dequantized to bf16 (:func:`gemm_mxfp8_bf16`, backend ``dequant-bf16``): both operands are
   dequantized by a Triton kernel to bf16 -- exact: an E4M3 value times 2**k has 4 significant
   bits, which bf16 holds for every result >= 2**-130 -- and one cuBLAS bf16 GEMM accumulates in
   float32 with a float32 output (``torch.mm(out_dtype=float32)``), rounded once.  It reads the
   weight three times over (E4M3 in, bf16 out and in), so it is for large M only.

Which is fastest depends on M (memory- vs compute-bound); scripts/bench_kernels.py measures all
three, the per-M choices are :data:`MXFP8_CONFIGS` / :data:`W128_CONFIGS` and ``by-shape``
(:data:`BY_SHAPE_MX`; the backend ``auto`` picks where Triton is compiled).  Above M = 64 ``by-shape``
dequantizes the weight per call: a transient bf16 copy of it (2 bytes per element) lives for the call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...formats import e8m0, mxfp8
from ...formats.fp8 import E4M3_MAX
from .. import dispatch
from .block_scaled import BLOCK_K, INT32_LIMIT, Config, Side, Workspace
from .fp8_block import ConfigTable, KernelConfig, flatten_act, matmul
from .skinny import SkinnyConfig
from ..triton_numerics import PRIORITY, available, cdiv, e8m0_decode

MX = mxfp8.BLOCK  # 32

# (largest M, config); first H200 run: at large M upcast beat per-32 promotion 3.6x for MX
# weights (promotion after every 32-deep dot stalls the tensor core), promotion beat upcast
# 1.2x for 128x128 weights; 64x128 / 4 warps tiles as for FP8-block.  Fifth pass (CUDA graphs,
# M = 1024 / 4096, five shapes): from M = 513 upcast 128x128 tiles on two warpgroups, 1.06-2.0x
# the 64x128 ones for MX weights and 0.97-1.24x the promoted 64x128 ones for 128x128 weights.
# Sixth pass (M = 1 / 16 / 64, all 14 served shapes, CUDA graphs): the small-M kernel on upcast
# operands (one bf16 dot per 128 columns) with 2 programs per SM, geomean 1.08 / 1.15 / 1.11x the
# per-32 promotion with 4 (MX weights) and 1.05 / 1.12 / 1.16x (128x128 weights); worst case 0.92x.
# Tenth pass (M = 1-32, 14 shapes, CUDA graphs, read flush): to M = 32 the block-diagonal per-32 dot
# (one fp8 dot per 128 columns, token tiles from 4 rows), geomean 0.96 / 0.94 / 0.88 / 0.75 / 0.64x the
# FP8-block kernel's time at M = 1 / 4 / 8 / 16 / 32 against the upcast config's 0.57-0.60x; at M = 64
# it fell to 0.35x (a [64, 256] product per step) where upcast keeps 0.51x.
MXFP8_CONFIGS: ConfigTable = (
    (32, SkinnyConfig(block_n=64, waves=2, num_warps=4, num_stages=4)),
    (64, SkinnyConfig(block_n=64, waves=2, upcast=True, num_warps=4, num_stages=4)),
    (512, Config(64, 128, upcast=True, num_warps=4, num_stages=3)),
    (INT32_LIMIT, Config(128, 128, upcast=True, tma=True, num_warps=8, num_stages=3)),
)
W128_CONFIGS: ConfigTable = (
    (64, SkinnyConfig(block_n=64, waves=2, upcast=True, num_warps=4, num_stages=4)),
    (512, Config(64, 128, num_warps=4, num_stages=4)),
    (INT32_LIMIT, Config(128, 128, upcast=True, tma=True, num_warps=8, num_stages=3)),
)
# by-shape for gemm_mxfp8: the Triton kernels up to this M, dequant-bf16 above.  Eleventh pass (H200, 14 served shapes,
# CUDA graphs, read flush; geomean FP8-block time / MX time): Triton 0.77 / 0.65 / 0.51 at M = 16 / 32 / 64 against
# dequant-bf16's 0.29 / 0.36 / 0.42; from M = 96 dequant-bf16 0.40-0.41 at M = 96-512 against the table's 0.17-0.21 and
# the best Triton config tried (tiled 64x128 with split-K, small-M upcast, 128-row tiles on 8 warps) 0.20-0.34.
BY_SHAPE_MX: tuple[tuple[int, str], ...] = ((64, "triton"), (INT32_LIMIT, "dequant-bf16"))


def _mx_scales(s: torch.Tensor) -> torch.Tensor:
    """E8M0 scales as stored (U8 or float8_e8m0fnu) -> the U8 bytes the kernel reads."""
    assert s.dtype in (torch.uint8, torch.float8_e8m0fnu), f"E8M0 scales must be U8 or F8_E8M0, got {s.dtype}"
    return s.view(torch.uint8)


def _check_k(a: torch.Tensor) -> None:
    if a.shape[-1] % MX:
        raise ValueError(f"MXFP8 needs K to be a multiple of {MX}, got {a.shape[-1]}")


def _mx_side(q: torch.Tensor, s: torch.Tensor) -> Side:
    """MX activation rows (1x32 E8M0 scales) as a GEMM operand."""
    return Side(q, _mx_scales(s), 1, MX)


def gemm_mxfp8(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: KernelConfig | None = None,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """A E4M3 [..., K] + U8 [..., K/32] x W E4M3 [N, K] + U8 [N, K/32] -> out_dtype [..., N] (emulated MX)."""
    _check_k(a)
    return matmul(a, a_scale, _mx_side, Side(w, _mx_scales(w_scale), 1, MX), MXFP8_CONFIGS, bias, out_dtype, config, workspace)


def gemm_mxfp8_w128(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: KernelConfig | None = None,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """MX activations (1x32 E8M0) x a weight from :func:`requant_weight_128` (power-of-two F32 128x128 scales)."""
    _check_k(a)
    ws = w_scale.to(torch.float32)
    return matmul(a, a_scale, _mx_side, Side(w, ws, BLOCK_K, BLOCK_K, pow2=True), W128_CONFIGS, bias, out_dtype, config, workspace)


@triton.jit
def _mx_to_bf16_kernel(q_ptr, s_ptr, out_ptr, n_el, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """out = E4M3 q * 2**(s - 127) over a flat contiguous [R, K] with U8 scales [R, K/32]."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_el
    q = tl.load(q_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = e8m0_decode(tl.load(s_ptr + offs // 32, mask=mask, other=127).to(tl.int32))
    tl.store(out_ptr + offs, (q * s).to(OUT_DTYPE), mask=mask)


def mx_to_bf16(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """E4M3 [R, K] + U8 E8M0 [R, K/32] -> bf16 [R, K], exact for every result >= 2**-130 (see module docstring)."""
    assert q.dtype == torch.float8_e4m3fn and q.is_contiguous(), f"E4M3 contiguous rows needed, got {q.dtype} strides {q.stride()}"
    s = _mx_scales(scale).contiguous()
    assert q.shape[-1] % MX == 0 and tuple(s.shape) == (*q.shape[:-1], q.shape[-1] // MX), f"scales {tuple(s.shape)} do not fit {tuple(q.shape)}"
    assert q.numel() < INT32_LIMIT, f"{q.numel()} elements overflow 32-bit offsets"
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)  # [R, K]
    block = 2048
    # the CPU interpreter stores bf16 by truncation: exact here too, every product is a bf16 value
    _mx_to_bf16_kernel[(cdiv(q.numel(), block),)](q, s, out, q.numel(), OUT_DTYPE=tl.bfloat16, BLOCK=block, num_warps=8)
    return out


def _mm_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 [M, N] = x [M, K] @ w [N, K].T for exact bf16 operands: cuBLAS bf16 GEMM with a
    float32 output on CUDA, a float32 matmul elsewhere (the same values, summation order aside)."""
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return x.float() @ w.float().t()


def gemm_mxfp8_bf16(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """The MX function through exact bf16 dequantization and one float32-output bf16 GEMM (path 3)."""
    _check_k(a)
    a2, s2 = flatten_act(a, a_scale)
    y = _mm_f32(mx_to_bf16(a2.contiguous(), s2), mx_to_bf16(w, w_scale))  # [M, N] f32
    if bias is not None:
        y += bias.to(torch.float32)
    return y.to(out_dtype).reshape(*a.shape[:-1], w.shape[0])


def by_shape_choice_mx(m: int) -> str:
    return next(b for m_max, b in BY_SHAPE_MX if m <= m_max)


def gemm_mxfp8_by_shape(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """Triton (small M) or dequant-bf16 (large M) per :data:`BY_SHAPE_MX`."""
    if by_shape_choice_mx(a.numel() // a.shape[-1]) == "triton":
        return gemm_mxfp8(a, a_scale, w, w_scale, bias, out_dtype)
    return gemm_mxfp8_bf16(a, a_scale, w, w_scale, bias, out_dtype)


def _explicit(device: torch.device) -> dispatch.Availability:
    """Where Triton runs, but never chosen by auto (slow at small M: ``by-shape`` picks it above)."""
    why = available(device)
    return dispatch.Availability(why.ok, auto=False, reason=why.reason or "explicit only (by-shape runs it at large M)")


def _tile_max_exponent(scale: torch.Tensor, n: int, kb: int) -> torch.Tensor:
    """U8 [N, K/32] -> int32 [ceil(N/128), ceil(K/128)]: the largest E8M0 byte of each tile's blocks."""
    b = scale.view(torch.uint8).to(torch.int32)
    pad_n, pad_k = (-n) % BLOCK_K, (-b.shape[1]) % (BLOCK_K // MX)
    b = torch.nn.functional.pad(b, (0, pad_k, 0, pad_n))  # zero bytes never raise a max
    return b.reshape(b.shape[0] // BLOCK_K, BLOCK_K, kb, BLOCK_K // MX).amax(dim=(1, 3))


def requant_weight_128(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 weight [N, K] + U8 [N, K/32] -> FP8-block (E4M3 [N, K], power-of-two F32 [ceil(N/128), ceil(K/128)]).

    Exact or nothing: each tile takes its largest block exponent b_max and each element becomes
    q * 2**(b - b_max); a ValueError names the first tile where that is not an E4M3 value
    (a NaN scale byte is never exact).
    """
    n, k = q.shape
    if k % MX or tuple(scale.shape) != (n, k // MX):
        raise ValueError(f"MXFP8 weight {tuple(q.shape)} needs K % 32 == 0 and scales [{n}, {k // MX}], got {tuple(scale.shape)}")
    kb = -(-k // BLOCK_K)
    bmax = _tile_max_exponent(scale, n, kb)  # [nb, kb]
    b = scale.view(torch.uint8).to(torch.int32)  # [N, K/32]
    per_block = bmax.repeat_interleave(BLOCK_K, 0)[:n].repeat_interleave(BLOCK_K // MX, 1)[:, : k // MX]
    shift = (b - per_block).clamp(min=-30)  # below 2**-18 a nonzero E4M3 code cannot survive anyway
    v = q.to(torch.float32) * e8m0.pow2(shift).repeat_interleave(MX, 1)  # exact in float32
    q128 = v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    bad = (q128.to(torch.float32) != v) | (b == e8m0.NAN_BYTE).repeat_interleave(MX, 1)
    if bool(bad.any()):
        r, c = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"MXFP8 -> 128x128 is not exact: tile ({r // BLOCK_K}, {c // BLOCK_K}) element ({r}, {c}) "
            f"loses bits when its block scale 2**{int(b[r, c // MX]) - 127} becomes the tile's 2**{int(bmax[r // BLOCK_K, c // BLOCK_K]) - 127}"
        )
    return q128, e8m0.decode(bmax.to(torch.uint8))


dispatch.register("gemm_mxfp8", "triton", gemm_mxfp8, available=available, priority=PRIORITY)
dispatch.register("gemm_mxfp8", "dequant-bf16", gemm_mxfp8_bf16, available=_explicit, priority=PRIORITY - 1)
dispatch.register("gemm_mxfp8", "by-shape", gemm_mxfp8_by_shape, available=available, priority=PRIORITY + 1)
dispatch.register("gemm_mxfp8_w128", "triton", gemm_mxfp8_w128, available=available, priority=PRIORITY)
