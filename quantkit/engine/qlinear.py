"""Quantized linear weights and :func:`linear`, the one place a model touches quantized math.

A weight is a small module holding its packed buffers (gpt-fast style), out x in like ``nn.Linear``, optionally
stacked over experts ([E, N, K]): :class:`Dense` (``w`` BF16/F32 [.., N, K]) or :class:`Quantized`, a weight of a
registered format (:mod:`quantkit.formats`), whose format object says everything this module asks: the buffers
(named as on the format's ``buffers``), their check, the dequantization op, the activation quantization its GEMM
takes (``act_scale``) and the GEMM op.  The built-in formats also have named classes here (the same behaviour):

| format       | class      | buffers                                                            | activations when ``act`` is set |
|--------------|------------|--------------------------------------------------------------------|---------------------------------|
| ``fp8-block``| Fp8Block   | ``q`` F8_E4M3 [.., N, K] + ``scale_inv`` F32 [.., ceil(N/128), ceil(K/128)] | E4M3 per token per 128 channels (DeepSeek act_quant) |
| ``mxfp8``    | Mxfp8      | ``q`` F8_E4M3 [.., N, K] + ``scale`` U8 E8M0 [.., N, K/32]          | E4M3 per token per 32 channels, E8M0 |
| ``mxfp4``    | Mxfp4      | ``blocks`` U8 [.., N, K/32, 16] + ``scales`` U8 [.., N, K/32] (GPT-OSS) | none (GPT-OSS serves MXFP4 as w4a16) |

Numerics (the spec every kernel reproduces): the activation is quantized dynamically and
dequantized (:mod:`quantkit.formats`), the weight is dequantized, and the product
``x_dq @ w_dq.T`` (+ bias) is computed in float32, then cast to the activation dtype.  This is
DeepSeek's fp8_gemm (per-tile f32 partial sums times both scales) up to f32 summation order.

Ops per weight (each through a :class:`quantkit.kernels.dispatch.Dispatcher`, the weight's
``ops``; the loader gives all weights of a model one, so ``model.ops.ran`` names the kernel each op ran
last -- the formats references on CPU; on GPUs the leaf its selection chose, e.g. ``triton.wgmma``):

| weight                          | ops                                                            |
|---------------------------------|----------------------------------------------------------------|
| ``act`` set (fp8-block, mxfp8)  | the format's activation quantizer (``act_quant_fp8_block`` / ``act_quant_mxfp8``), then its ``gemm_op`` |
| ``act`` None                    | the format's dequantizer (``fp8_block_dequant``, ``mxfp8_dequant``, ``mxfp4_decode``; dense: none), then a float32 matmul |
| input already quantized (:func:`linear_quantized`, ``Linear.quantized``) | the GEMM op only |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .. import formats
from ..formats import Format, e8m0
from ..formats.fp8_block import SCALE_FMTS
from ..kernels.dispatch import Dispatcher


@dataclass(frozen=True)
class ActQuant:
    """Dynamic activation quantization of a quantized linear's input."""

    kind: str  # a format with activation quantization (formats.act_formats(): fp8-block 1x128, mxfp8 1x32 E8M0)
    scale_fmt: str = "float"  # fp8-block only: "float" | "ue8m0"
    rule: str = e8m0.DEFAULT_RULE  # E8M0 scale rule (mxfp8, and fp8-block ue8m0)
    scale_mn: bool = False  # fp8-block only: scales written MN-major (formats.fp8_block.empty_act_scales), as DeepGEMM reads them

    def __post_init__(self) -> None:
        kinds = formats.act_formats()
        if self.kind not in kinds or self.scale_fmt not in SCALE_FMTS:
            raise ValueError(f"activation quantization {self.kind!r} / scale format {self.scale_fmt!r} is not one of "
                             f"{', '.join(kinds)} / {', '.join(SCALE_FMTS)}")  # fmt: skip
        if self.scale_mn and not self.format.scale_mn:
            raise ValueError(f"MN-major activation scales are an fp8-block layout, not {self.kind}'s")
        e8m0.check_rule(self.rule)

    @property
    def format(self) -> Format:
        return formats.get(self.kind)

    def layout(self) -> dict[str, bool]:
        """The quantizer ops' keyword for the scale layout (none for the default, row-major)."""
        return {"scale_mn": True} if self.scale_mn else {}


class QWeight(nn.Module):
    """Base of the packed weight modules; ``shape`` is (N, K) of one (expert's) matrix."""

    fmt: str = ""

    def __init__(self, shape: tuple[int, ...], lead: tuple[int, ...], act: ActQuant | None = None, ops: Dispatcher | None = None) -> None:
        super().__init__()
        self.ops = ops if ops is not None else Dispatcher()
        if len(lead) > 1:
            raise ValueError(f"{self.fmt} weight: at most one stacking dim (experts), got {lead} x {shape}")
        self.shape = (int(shape[0]), int(shape[1]))
        self.num_experts = int(lead[0]) if lead else None
        if act is not None and act.kind != self.fmt:
            raise ValueError(f"{self.fmt} weight: activations quantized as {act.kind} have no GEMM with it")
        self.act = act

    def dequant(self, expert: int | None = None) -> torch.Tensor:
        """float32 [N, K] (of ``expert`` when stacked)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"{self.fmt}, shape={self.shape}, experts={self.num_experts}, act={self.act}"


def _sel(t: torch.Tensor, expert: int | None) -> torch.Tensor:
    return t if expert is None else t[expert]


class Dense(QWeight):
    fmt = "dense"

    def __init__(self, w: torch.Tensor, ops: Dispatcher | None = None) -> None:
        super().__init__(w.shape[-2:], w.shape[:-2], None, ops)
        self.register_buffer("w", w)

    def dequant(self, expert: int | None = None) -> torch.Tensor:
        return _sel(self.w, expert).to(torch.float32)


class Quantized(QWeight):
    """A weight of a registered format: its packed tensors as buffers named as ``format.buffers``."""

    def __init__(self, fmt: Format | str, *tensors: torch.Tensor, act: ActQuant | None = None, ops: Dispatcher | None = None) -> None:
        fmt = formats.get(fmt) if isinstance(fmt, str) else fmt
        self.fmt, self.format = fmt.name, fmt  # plain attributes, set before Module.__init__ for its messages
        lead, n, k = fmt.shape(tensors)
        super().__init__((n, k), lead, act, ops)
        fmt.check(tensors)
        for name, t in zip(fmt.buffers, fmt.pack(tensors), strict=True):
            self.register_buffer(name, t)

    def packed(self, expert: int | None = None) -> tuple[torch.Tensor, ...]:
        """The buffers (of ``expert`` when stacked) as the format's ops take them, e.g. fp8-block's (E4M3 [N, K],
        F32 scale_inv [ceil(N/128), ceil(K/128)])."""
        return tuple(_sel(getattr(self, name), expert) for name in self.format.buffers)

    def dequant(self, expert: int | None = None) -> torch.Tensor:
        return self.format.dequant(self.ops, *self.packed(expert))


class Fp8Block(Quantized):
    FORMAT = "fp8-block"

    def __init__(self, q: torch.Tensor, scale_inv: torch.Tensor, act: ActQuant | None = None, ops: Dispatcher | None = None) -> None:
        super().__init__(self.FORMAT, q, scale_inv, act=act, ops=ops)


class Mxfp8(Quantized):
    FORMAT = "mxfp8"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, act: ActQuant | None = None, ops: Dispatcher | None = None) -> None:
        super().__init__(self.FORMAT, q, scale, act=act, ops=ops)


class Mxfp4(Quantized):
    FORMAT = "mxfp4"

    def __init__(self, blocks: torch.Tensor, scales: torch.Tensor, ops: Dispatcher | None = None, *, act: ActQuant | None = None) -> None:
        super().__init__(self.FORMAT, blocks, scales, act=act, ops=ops)


def quantized(fmt: Format, tensors: Sequence[torch.Tensor], act: ActQuant | None, ops: Dispatcher | None) -> Quantized:
    """A weight of ``fmt`` from its packed tensors: of the class named for the format above where there is one
    (so a loaded fp8-block weight is an :class:`Fp8Block`), else a :class:`Quantized`."""
    for cls in Quantized.__subclasses__():
        if getattr(cls, "FORMAT", None) == fmt.name:
            return cls(*tensors, act=act, ops=ops)
    return Quantized(fmt, *tensors, act=act, ops=ops)


HALF = (torch.bfloat16, torch.float16)


def quantize_act(x: torch.Tensor, act: ActQuant, ops: Dispatcher) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic activation quantization: (E4M3 [..., K], its format's scales: F32 [..., ceil(K/128)] or U8 E8M0 [..., K/32])."""
    return act.format.act_quant(ops, x, act.scale_fmt, act.rule, **act.layout())


def linear(x: torch.Tensor, w: QWeight, bias: torch.Tensor | None = None, expert: int | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) for x [..., K] and one (expert's) weight [N, K]; float32 products, out in
    ``out_dtype`` (default x.dtype)."""
    out_dtype = out_dtype or x.dtype
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: input has {x.shape[-1]} features, weight {w.fmt} is {w.shape} (out x in)")
    if w.act is not None:  # fp8-block / mxfp8 (QWeight checks act.kind == fmt): the format's block-scaled GEMM op
        a, s = quantize_act(x.contiguous(), w.act, w.ops)
        return linear_quantized(a, s, w, out_dtype, bias, expert)
    b = None if bias is None else _sel(bias, expert)
    if isinstance(w, Dense) and b is None and x.is_cuda and x.dtype == out_dtype == w.w.dtype in HALF:
        # a 16-bit weight on a GPU: cuBLAS's 16-bit GEMM reads it as it is (exact products summed in float32, one
        # rounding to out_dtype; torch's allow_bf16_reduced_precision_reduction governs split-K sums) instead of a
        # float32 copy of it per call (the LM head: 2.3 GB written a step at GPT-OSS sizes)
        return torch.nn.functional.linear(x, _sel(w.w, expert))
    y = torch.nn.functional.linear(x.to(torch.float32), w.dequant(expert), None if b is None else b.to(torch.float32))
    return y.to(out_dtype)


def linear_quantized(
    a: torch.Tensor, a_scale: torch.Tensor, w: QWeight, out_dtype: torch.dtype, bias: torch.Tensor | None = None, expert: int | None = None
) -> torch.Tensor:
    """:func:`linear` of an input already quantized as ``w.act`` quantizes it (E4M3 [..., K] and its
    scales, e.g. from a fused norm or activation op): the GEMM op alone; out_dtype [..., N]."""
    if w.act is None:
        raise ValueError(f"linear: a {w.fmt} weight without activation quantization takes no pre-quantized input")
    grid = w.act.format.act_scale  # the format's activation scales, one per token per group of K
    groups, sdtype = grid.shape(1, w.shape[1])[1], torch.uint8 if grid.e8m0 else torch.float32
    if a.dtype != torch.float8_e4m3fn or a.shape[-1] != w.shape[1] or a_scale.shape != (*a.shape[:-1], groups) or a_scale.dtype != sdtype:
        raise ValueError(
            f"linear: a {w.fmt} weight {w.shape} takes E4M3 [..., {w.shape[1]}] + {sdtype} scales [..., {groups}], "
            f"got {a.dtype}{tuple(a.shape)} + {a_scale.dtype}{tuple(a_scale.shape)}"
        )
    b = None if bias is None else _sel(bias, expert)
    return w.ops.call(w.format.gemm_op, a, a_scale, *w.packed(expert), b, out_dtype)


class Linear(nn.Module):
    """A projection: packed weight + optional bias (kept in source precision)."""

    def __init__(self, weight: QWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = weight
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def quantized(self, a: torch.Tensor, a_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """The projection of an input quantized as ``self.weight.act`` asks (see :func:`linear_quantized`)."""
        return linear_quantized(a, a_scale, self.weight, out_dtype, self.bias)


def row_buffers(w: QWeight) -> tuple[tuple[str, int], ...]:
    """(buffer, weight rows per buffer row) of a weight: ``w``, or its format's buffers (fp8-block's scales: 128)."""
    return (("w", 1),) if isinstance(w, Dense) else tuple(zip(w.format.buffers, w.format.row_blocks, strict=True))


def _stackable(parts: Sequence[Linear]) -> bool:
    ws = [p.weight for p in parts]
    w0 = ws[0]
    if len(parts) < 2 or w0.num_experts is not None:
        return False
    if any(type(w) is not type(w0) or w.fmt != w0.fmt or w.act != w0.act or w.shape[1] != w0.shape[1] or w.num_experts is not None for w in ws):
        return False
    has_bias = [p.bias is not None for p in parts]
    if any(has_bias) != all(has_bias):
        return False
    if any(len({(getattr(w, name).dtype, getattr(w, name).device) for w in ws}) != 1 for name, _ in row_buffers(w0)):
        return False
    return not any(w.shape[0] % rows for w in ws[:-1] for _, rows in row_buffers(w0))


def fuse_rows(parts: Sequence[Linear]) -> Linear | None:
    """One projection whose output is the parts' outputs side by side (their weights stacked along N, one
    GEMM where there were several, e.g. DeepSeek's q_a_proj and kv_a_proj_with_mqa), sharing storage:
    every part's buffers become row views of the fused ones, so no weight is held twice.  None where the
    parts cannot stack: fewer than two, different formats, activation quantization, K, dtypes or
    devices, stacked experts, a bias on some but not all, or an FP8-block part before the last whose
    rows are not whole 128-row scale tiles."""
    if not _stackable(parts):
        return None
    ws = [p.weight for p in parts]
    w0, rows_of = ws[0], row_buffers(ws[0])
    cat = [torch.cat([getattr(w, name) for w in ws]) for name, _ in rows_of]
    fused = Dense(cat[0], w0.ops) if isinstance(w0, Dense) else quantized(w0.format, cat, w0.act, w0.ops)
    lo = 0
    for w in ws:  # each part now reads its rows of the fused buffers
        for name, rows in rows_of:
            setattr(w, name, getattr(fused, name)[lo // rows : -(-(lo + w.shape[0]) // rows)])  # a registered buffer: replaced
        lo += w.shape[0]
    bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
    return Linear(fused, bias)


class RowGroup:
    """Projections of one input (q / k / v; MLA's q_a and kv_a) run as one GEMM where they stack
    (:func:`fuse_rows`), each output a contiguous [..., N_i]; where they cannot, one call each.  The
    fused projection is made on first use, and again if the parts' buffers were replaced since (a
    ``.to``); it is kept off the module tree (its buffers are the parts' own storage)."""

    def __init__(self, parts: Sequence[Linear]) -> None:
        self.parts = tuple(parts)
        self._made: tuple[tuple, Linear | None] | None = None

    def _key(self) -> tuple:
        t = next(self.parts[0].weight.buffers())
        return (t.device, t.dtype, t.data_ptr())

    def fused(self) -> Linear | None:
        if self._made is None or self._made[0] != self._key():
            fused = fuse_rows(self.parts)
            self._made = (self._key(), fused)  # after fuse_rows: the parts' buffers are now views of the fused ones
        return self._made[1]

    def _split(self, y: torch.Tensor, views: bool) -> list[torch.Tensor]:
        parts = y.split([p.weight.shape[0] for p in self.parts], dim=-1)
        return list(parts) if views else [t.contiguous() for t in parts]

    def __call__(self, x: torch.Tensor, views: bool = False) -> list[torch.Tensor]:
        """Each part's projection of x; ``views``: the fused GEMM's outputs as column views of one tensor (no copies)."""
        fused = self.fused()
        return [p(x) for p in self.parts] if fused is None else self._split(fused(x), views)

    def quantized(self, a: torch.Tensor, a_scale: torch.Tensor, out_dtype: torch.dtype, views: bool = False) -> list[torch.Tensor]:
        """Each part's projection of an input quantized as they all ask (:meth:`Linear.quantized`)."""
        fused = self.fused()
        if fused is None:
            return [p.quantized(a, a_scale, out_dtype) for p in self.parts]
        return self._split(fused.quantized(a, a_scale, out_dtype), views)
