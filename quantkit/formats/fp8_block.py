"""FP8 E4M3 with block scales: weights per 128x128 tile, activations per token per 128 channels.

Layout (HF fine-grained FP8, DeepSeek-V3 README_WEIGHTS.md): ``weight`` F8_E4M3 [N, K] and
``weight_scale_inv`` F32 [ceil(N/128), ceil(K/128)]; dequantize by MULTIPLYING each tile by its
scale (despite the name).  Edge tiles may be partial: the tile is zero-padded to 128x128 for its
scale, then cut (DeepSeek's rule; zero padding never changes an amax).  Leading dims (stacked
experts [E, N, K]) are batch dims with scales [E, ceil(N/128), ceil(K/128)].

The one quantization formula, used by every path (kernels included):

    amax = max(|x| over the tile or group, 1e-4)        # DeepSeek act_quant's floor: an
                                                        # all-zero tile gets s = 1e-4/448
    s    = amax / 448                 (scale_fmt "float", float32 IEEE division)
    s    = 2**k, k = exponent(amax, "e4m3", rule)       (scale_fmt "ue8m0"; rule rceil gives
                                                        DeepSeek's 2**ceil(log2(amax/448)))
    q    = round_e4m3(clamp(x / s, -448, 448))          # DIVIDE, IEEE, then round
    stored scale = s                                    # "scale_inv" is s itself

Activations (DeepSeek inference/kernel.py act_quant) use the same formula per 1x128 group.

Activation scales come in two layouts of the same [..., G] tensor (the values are the same):
row-major (contiguous, the default) or MN-major (``scale_mn=True``): a strided view, strides
(..., 1, M4), of an F32 buffer [G, M4] whose M4 = M rounded up to 4 columns hold the tokens (zero
past M).  MN-major is what DeepGEMM's TMA loads (and cuBLAS as the transpose) read, so a
quantizer that writes it saves the GEMM a transposing launch; every kernel here reads either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from . import e8m0
from .fp8 import E4M3_MAX, round_e4m3
from .registry import Format, Grid, Spec
from .rounding import NEAREST, Rounding

BLOCK = 128
AMAX_FLOOR = 1e-4
SCALE_FMTS = ("float", "ue8m0")


def _scale(amax: torch.Tensor, scale_fmt: str, rule: str) -> torch.Tensor:
    if scale_fmt not in SCALE_FMTS:
        raise ValueError(f"scale format must be one of {SCALE_FMTS}, not {scale_fmt!r}")
    amax = amax.to(torch.float32).clamp(min=AMAX_FLOOR)
    if scale_fmt == "float":
        # a tensor divisor: torch on CUDA turns `tensor / python_scalar` into a multiply by the
        # rounded reciprocal, which is not the IEEE quotient the CPU (and every kernel) computes
        return amax / torch.full_like(amax, E4M3_MAX)
    return e8m0.pow2(e8m0.exponent(amax, "e4m3", rule))


def scale_from_amax(amax: torch.Tensor, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE) -> torch.Tensor:
    """The stored scale of each tile (or group) with absolute maximum ``amax``: the formula above."""
    return _scale(amax, scale_fmt, rule)


def _pad_tiles(x: torch.Tensor, block: int) -> torch.Tensor:
    """[..., N, K] -> zero-padded [..., N', K'] with N', K' multiples of ``block``."""
    n, k = x.shape[-2:]
    pn, pk = (-n) % block, (-k) % block
    if pn or pk:
        x = torch.nn.functional.pad(x, (0, pk, 0, pn))
    return x


def tile_amax(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Per-tile absolute max of [..., N, K] -> float32 [..., ceil(N/b), ceil(K/b)]."""
    p = _pad_tiles(x.to(torch.float32).abs(), block)
    *lead, n, k = p.shape
    return p.reshape(*lead, n // block, block, k // block, block).amax(dim=(-3, -1))


def expand_tiles(s: torch.Tensor, n: int, k: int, block: int = BLOCK) -> torch.Tensor:
    """Tile scales [..., tn, tk] -> per-element [..., n, k] (edge tiles cut)."""
    return s.repeat_interleave(block, -2).repeat_interleave(block, -1)[..., :n, :k]


def quantize_weight(
    w: torch.Tensor,
    scale_fmt: str = "float",
    rule: str = e8m0.DEFAULT_RULE,
    rounding: Rounding = NEAREST,
    block: int = BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] -> (F8_E4M3 [..., N, K], F32 scale_inv [..., ceil(N/128), ceil(K/128)])."""
    n, k = w.shape[-2:]
    p = _pad_tiles(w.to(torch.float32), block)  # a view of the f32 copy when N, K are whole tiles
    *lead, pn, pk = p.shape
    tiles = p.reshape(*lead, pn // block, block, pk // block, block)
    s = _scale(tiles.abs().amax(dim=(-3, -1)), scale_fmt, rule)
    # the same IEEE quotient x / s per element as dividing by expand_tiles(s), without expanding
    v = (tiles / s[..., :, None, :, None]).reshape(*lead, pn, pk)[..., :n, :k]
    return round_e4m3(v, rounding), s


def dequantize_weight(q: torch.Tensor, scale_inv: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """DeepSeek's rule: each (possibly partial) tile times its scale, in float32."""
    n, k = q.shape[-2:]
    want = (-(-n // block), -(-k // block))
    if tuple(scale_inv.shape[-2:]) != want:
        raise ValueError(f"scale grid {tuple(scale_inv.shape)} does not fit a weight of {tuple(q.shape)} in {block}x{block} tiles")
    return q.to(torch.float32) * expand_tiles(scale_inv.to(torch.float32), n, k, block)


def quantize_act(
    x: torch.Tensor, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, group: int = BLOCK, *, scale_mn: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (F8_E4M3 [..., K], F32 scales [..., ceil(K/group)]), one scale per token per group;
    ``scale_mn``: the scales MN-major (:func:`act_scales_mn`)."""
    k = x.shape[-1]
    pk = (-k) % group
    xf = x.to(torch.float32)
    g = torch.nn.functional.pad(xf, (0, pk)).reshape(*x.shape[:-1], (k + pk) // group, group)  # no -1: zero rows allowed
    s = _scale(g.abs().amax(-1), scale_fmt, rule)
    q = round_e4m3(xf / s.repeat_interleave(group, -1)[..., :k])
    return q, (act_scales_mn(s) if scale_mn else s)


MN_ALIGN = 4  # MN-major activation scales: token columns padded to a multiple of 4 (16-byte rows)


def mn_rows(m: int) -> int:
    """Columns of an MN-major scale buffer for M tokens."""
    return -(-m // MN_ALIGN) * MN_ALIGN


def _mn_view(base: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """[*lead, G] over an MN-major buffer [G, rows]: tokens row-major over the leading dims, one column each."""
    strides, acc = [], 1
    for d in reversed(lead):
        strides.insert(0, acc)
        acc *= d
    return base.as_strided((*lead, base.shape[0]), (*strides, base.shape[1]))


def empty_act_scales(lead: tuple[int, ...], groups: int, device: torch.device | str, scale_mn: bool = False) -> torch.Tensor:
    """F32 [*lead, groups] to be filled: contiguous, or MN-major over [groups, mn_rows(M)] whose padding
    columns the filler zeroes (:func:`mn_major_storage` gives the buffer back)."""
    if not scale_mn:
        return torch.empty((*lead, groups), dtype=torch.float32, device=device)
    return _mn_view(torch.empty((groups, mn_rows(math.prod(lead))), dtype=torch.float32, device=device), lead)


def mn_major_copy(s2: torch.Tensor, rows: int) -> torch.Tensor:
    """Scales [M, G] -> a new F32 [G, rows] buffer holding them MN-major (rows >= M; the columns past M zero):
    one transposing copy.  Strides (rows, 1), even for M = 1."""
    m, groups = s2.shape
    alloc = torch.empty if rows == m else torch.zeros  # zeros only where there are padding columns
    base = alloc((groups, rows), dtype=torch.float32, device=s2.device)
    base[:, :m].copy_(s2.t())
    return base


def act_scales_mn(s: torch.Tensor) -> torch.Tensor:
    """Activation scales [..., G] (any layout) -> the same values MN-major (one copy; padding zero)."""
    lead = tuple(s.shape[:-1])
    m = math.prod(lead)
    return _mn_view(mn_major_copy(s.reshape(m, s.shape[-1]), mn_rows(m)), lead)


def mn_major_storage(s: torch.Tensor) -> torch.Tensor | None:
    """The [G, mn_rows(M)] buffer under MN-major activation scales [..., G] (None for any other layout):
    the operand DeepGEMM and cuBLAS read, no copy.  Strides cannot tell a [1, 1] tensor's layout: it is
    taken as MN-major where its storage holds the 4 floats of the buffer (padding columns are only ever
    multiplied by zero rows of A, so their values do not reach an output)."""
    if s.dtype != torch.float32 or s.dim() < 1:
        return None
    groups = s.shape[-1]
    m = s.numel() // groups if groups else 0
    if m == 0:
        return None
    s2 = s.reshape(m, groups) if s.dim() != 2 else s  # a view where the tokens merge (MN-major ones do)
    rows = mn_rows(m)
    if (m > 1 and s2.stride(0) != 1) or (groups > 1 and s2.stride(1) != rows):
        return None
    if s2.untyped_storage().nbytes() < (s2.storage_offset() + groups * rows) * 4:
        return None  # the padding columns are not there
    return s2.as_strided((groups, rows), (rows, 1))


def dequantize_act(q: torch.Tensor, s: torch.Tensor, group: int = BLOCK) -> torch.Tensor:
    return q.to(torch.float32) * s.repeat_interleave(group, -1)[..., : q.shape[-1]]


def is_pow2_scale(scale_inv: torch.Tensor) -> bool:
    """True when every scale is 2**k with -127 <= k <= 127, an E8M0 value (V3.1 ue8m0 checkpoints).

    Inf is not (its mantissa field is zero too); 2**-127 is a float32 subnormal (0x00400000)."""
    bits = scale_inv.to(torch.float32).view(torch.int32)
    e_field = (bits >> 23) & 0xFF
    normal = ((bits & 0x7FFFFF) == 0) & (bits > 0)  # sign clear, mantissa zero
    ok = (normal & (e_field >= 1) & (e_field <= 254)) | (bits == 0x00400000)
    return bool(ok.all())


class Fp8BlockFormat(Format):
    """``fp8-block`` as every part of quantkit asks for it (:class:`~quantkit.formats.registry.Format`).

    ``convert --to fp8-block`` writes HF/DeepSeek fine-grained FP8: ``weight`` F8_E4M3 [.., N, K] + ``weight_scale_inv``
    F32 tile grid, and ``quantization_config`` quant_method fp8 (transformers FineGrainedFP8Config, vLLM/SGLang
    ``fp8``): activation_scheme dynamic, fmt e4m3, weight_block_size [128, 128]; ``scale_fmt: ue8m0`` when the scales
    are powers of two (DeepSeek-V3.1); ``modules_to_not_convert`` lists the projections ``--ignore`` kept (absent when
    none, as in DeepSeek's and Qwen's releases).  Served activations: one scale per token per 128 channels, UE8M0
    when the checkpoint's scales are (DeepSeek act_quant's 2**ceil(log2 s) is rule rceil), MN-major where asked."""

    name = "fp8-block"
    description = "E4M3 with one F32 scale per 128x128 tile (HF/DeepSeek fine-grained FP8)"
    scale_suffix = "weight_scale_inv"
    is_target = True
    convert_to = True
    buffers = ("q", "scale_inv")
    row_blocks = (1, BLOCK)
    weight_scale = Grid(BLOCK, BLOCK, e8m0=False, partial=True)
    act_scale = Grid(1, BLOCK, e8m0=False, partial=True)
    scale_mn = True
    scale_fmts = SCALE_FMTS
    act_rule = "rceil"
    references = {"fp8_block_quantize_weight": quantize_weight, "fp8_block_dequant": dequantize_weight, "act_quant_fp8_block": quantize_act}
    gemm_op = "gemm_fp8_block"

    def dequantize_weight(self, q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
        return dequantize_weight(q, scale_inv)

    def dequant(self, ops: Any, q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
        return ops.call("fp8_block_dequant", q, scale_inv)

    def act_scale_fmt(self, checkpoint_scale_fmt: str) -> str:
        return checkpoint_scale_fmt

    def quantize_act(self, x: torch.Tensor, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE,
                     *, scale_mn: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        return quantize_act(x, scale_fmt, rule, scale_mn=scale_mn)

    def dequantize_act(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return dequantize_act(q, s)

    def act_quant(self, ops: Any, x: torch.Tensor, scale_fmt: str, rule: str, **layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.call("act_quant_fp8_block", x, scale_fmt, rule, **layout)

    def stored(self, name: str, module: str, shape: tuple[int, ...], fused: bool) -> tuple[Spec, ...]:
        *lead, n, k = shape
        return (name, torch.float8_e4m3fn, shape), (name + "_scale_inv", torch.float32, (*lead, -(-n // BLOCK), -(-k // BLOCK)))

    def quantize(self, call: Callable[..., Any], x: torch.Tensor, scale_fmt: str, rule: str, rounding: Rounding = NEAREST) -> tuple[torch.Tensor, ...]:
        return call("fp8_block_quantize_weight", x, scale_fmt, rule, rounding)

    def dequantize(self, call: Callable[..., Any], *tensors: torch.Tensor) -> torch.Tensor:
        return call("fp8_block_dequant", *tensors)

    def uses_rule(self, scale_fmt: str | None) -> bool:
        return scale_fmt == "ue8m0"

    def qconfig(self, scale_fmt: str | None, kept: list[str], unquantized: list[str], fused: bool) -> dict | None:
        qc: dict = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK]}
        if scale_fmt == "ue8m0":
            qc["scale_fmt"] = "ue8m0"
        if kept:
            qc["modules_to_not_convert"] = kept
        return qc


class Fp8BlockUe8m0(Format):
    """``fp8-block-ue8m0``: how ``inspect`` names fp8-block weights whose every scale is a power of two."""

    name = "fp8-block-ue8m0"
    description = "fp8-block with power-of-two (UE8M0) scales, DeepSeek-V3.1 style"
    scale_suffix = "weight_scale_inv"
