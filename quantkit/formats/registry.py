"""The one registry of numeric formats, and :class:`Format`, all that the rest of quantkit asks of one.

A format module defines one subclass of :class:`Format` that sets ``name``; defining the class registers one
instance of it (as gguf-py's quantization classes register by subclassing), so a format is added in one file.
``quantkit convert`` (its ``--to`` choices, what it writes), the engine's quantized linear and MoE
(:mod:`quantkit.engine.qlinear`), the fused MoE op and the kernels' references ask the registered object instead of
branching on a name (``inspect`` reports formats by these names):

* identity: ``name``, ``description``, ``scale_suffix`` (the scale beside ``weight`` on disk), ``is_target``
  (a serving target, DESIGN.md's table), ``convert_to`` (``quantkit convert --to`` writes it);
* one weight [.., N, K], out x in, as the engine holds it: ``buffers`` (packed tensors, the weight first),
  ``row_blocks`` (weight rows per row of each), ``weight_scale`` (a :class:`Grid`), :meth:`check`, :meth:`pack`;
* activations: ``act_scale``, the per-token dynamic quantization its GEMM takes (None: the weight is
  dequantized and multiplied in float32, as GPT-OSS serves MXFP4), ``scale_mn`` (MN-major scales possible);
* ops: ``references`` (dispatcher op name -> its pure-torch function here), ``gemm_op``, and the methods
  that call them through a dispatcher (``ops.call``) with each op's own arguments;
* conversion targets (``convert_to``): :meth:`stored`, :meth:`quantize`, :meth:`dequantize`, :meth:`qconfig`,
  :meth:`uses_rule`, ``scale_fmts``.

A format described only (``Format(name, description, scale_suffix, is_target)``, e.g. inspect's label
``fp8-block-ue8m0``) has none of the behaviour.  Nothing here imports more than torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from . import e8m0
from .rounding import NEAREST, Rounding

Spec = tuple[str, torch.dtype, tuple[int, ...]]  # an output tensor of a conversion: name, dtype, shape


@dataclass(frozen=True)
class Grid:
    """The scales of a block-scaled [.., N, K] tensor: one per ``rows`` x ``cols`` block."""

    rows: int  # weight rows (N) per scale; 1 for per-row (and per-token) scales
    cols: int  # K columns per scale
    e8m0: bool  # U8 E8M0 bytes (powers of two); else float32
    partial: bool  # an edge block may be partial (zero-padded for its scale, then cut); else K % cols == 0

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """The scale dtypes accepted (E8M0 bytes as U8 or as torch's float8_e8m0fnu)."""
        return (torch.uint8, torch.float8_e8m0fnu) if self.e8m0 else (torch.float32,)

    def shape(self, n: int, k: int) -> tuple[int, int]:
        """The scale grid of an [N, K] matrix (partial edge blocks counted where the grid has them)."""
        if self.partial:
            return -(-n // self.rows), -(-k // self.cols)
        return n // self.rows, k // self.cols

    def row_bytes(self, k: int) -> int:
        """Bytes of one row's scales along K."""
        return self.shape(1, k)[1] * (1 if self.e8m0 else 4)


class Format:
    """A weight format; a subclass setting ``name`` registers itself (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    scale_suffix: ClassVar[str | None] = None
    is_target: ClassVar[bool] = False
    convert_to: ClassVar[bool] = False
    buffers: ClassVar[tuple[str, ...]] = ()
    row_blocks: ClassVar[tuple[int, ...]] = ()
    weight_scale: ClassVar[Grid | None] = None
    act_scale: ClassVar[Grid | None] = None
    scale_mn: ClassVar[bool] = False
    scale_fmts: ClassVar[tuple[str, ...]] = ()  # choices of ``convert --scale-fmt`` for its weight scales (empty: one format)
    act_rule: ClassVar[str] = e8m0.DEFAULT_RULE  # E8M0 rule of the activations when served
    references: ClassVar[dict[str, Callable[..., Any]]] = {}
    gemm_op: ClassVar[str | None] = None

    def __init__(self, name: str | None = None, description: str = "", scale_suffix: str | None = None, is_target: bool = False) -> None:
        if name is not None:  # a format described only
            self.name, self.description, self.scale_suffix, self.is_target = name, description, scale_suffix, is_target  # type: ignore[misc]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls):
            register(cls())

    def __repr__(self) -> str:
        return f"<format {self.name}>"

    def _unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"format {self.name!r} has no {what}")

    # ---- one weight [.., N, K] as packed tensors (the engine's buffers, in ``buffers`` order)

    def shape(self, tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], int, int]:
        """(stacking dims, N, K) of a weight's packed tensors."""
        *lead, n, k = tensors[0].shape
        return tuple(lead), n, k

    def check(self, tensors: Sequence[torch.Tensor]) -> None:
        """ValueError where the tensors are not this format's layout: E4M3 [.., N, K] and ``weight_scale`` scales."""
        q, s = tensors
        grid = self.weight_scale
        if grid is None:
            raise self._unsupported("packed weight")
        lead, n, k = self.shape(tensors)
        want = (*lead, *grid.shape(n, k))
        if q.dtype != torch.float8_e4m3fn or not grid.partial and k % grid.cols or tuple(s.shape) != want:
            rule, kind = ("", "") if grid.partial else (f", K % {grid.cols} == 0", "U8 " if grid.e8m0 else "")
            raise ValueError(f"{self.name} weight {q.dtype}{tuple(q.shape)} needs F8_E4M3{rule} and {kind}scales {want}, got {tuple(s.shape)}")

    def pack(self, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The tensors as the engine keeps them: scales as float32, or E8M0 bytes viewed as U8."""
        q, s = tensors
        return q, (s.view(torch.uint8) if self.weight_scale is not None and self.weight_scale.e8m0 else s.to(torch.float32))

    def dequantize_weight(self, *tensors: torch.Tensor) -> torch.Tensor:
        """The pure-torch reference: packed tensors of one weight -> float32 [.., N, K]."""
        raise self._unsupported("dequantization")

    def dequant(self, ops: Any, *tensors: torch.Tensor) -> torch.Tensor:
        """:meth:`dequantize_weight` through the dispatcher ``ops`` (its ``dequant`` op)."""
        raise self._unsupported("dequantization op")

    # ---- activations (formats whose GEMM quantizes them: ``act_scale`` set)

    def check_act(self, scale_fmt: str, k: int, scale_mn: bool) -> None:
        """ValueError where this format's activations cannot be quantized so (K, scale layout)."""
        grid = self.act_scale
        if grid is None:
            raise ValueError(f"{self.name} has no activation quantization")
        if not grid.partial and k % grid.cols:
            raise ValueError(f"{self.name.upper()} needs K to be a multiple of {grid.cols}, got {k}")
        if scale_mn and not self.scale_mn:
            raise ValueError(f"MN-major scales (scale_mn) are an fp8-block layout, not {self.name}'s")

    def act_scale_fmt(self, checkpoint_scale_fmt: str) -> str:
        """The activation scale format served with weights whose checkpoint says ``checkpoint_scale_fmt``."""
        return "float"

    def quantize_act(self, x: torch.Tensor, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE,
                     *, scale_mn: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The pure-torch reference: x [..., K] -> (E4M3 [..., K], scales [..., groups])."""
        raise self._unsupported("activation quantization")

    def dequantize_act(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        raise self._unsupported("activation dequantization")

    def act_quant(self, ops: Any, x: torch.Tensor, scale_fmt: str, rule: str, **layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`quantize_act` through the dispatcher ``ops``."""
        raise self._unsupported("activation quantization op")

    def gemm_ref(self, a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                 bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:  # fmt: skip
        """The reference of ``gemm_op``: dequant(a) @ dequant(w).T (+ bias) in float32, rounded once to out_dtype."""
        x = self.dequantize_act(a, a_scale).reshape(-1, a.shape[-1])
        y = x @ self.dequantize_weight(w, w_scale).T
        if bias is not None:
            y = y + bias.to(torch.float32)
        return y.to(out_dtype).reshape(*a.shape[:-1], y.shape[-1])

    # ---- as a conversion target (``convert_to``)

    def stored(self, name: str, module: str, shape: tuple[int, ...], fused: bool) -> tuple[Spec, ...]:
        """The tensors a weight ``name`` (of ``module``) of logical ``shape`` [.., N, K] is written as, the weight first;
        ``fused``: a GPT-OSS fused expert tensor.  ValueError for a shape this format has no layout for."""
        raise self._unsupported("on-disk layout")

    def quantize(self, call: Callable[..., Any], x: torch.Tensor, scale_fmt: str, rule: str,
                 rounding: Rounding = NEAREST) -> tuple[torch.Tensor, ...]:  # fmt: skip
        """float32 rows [r, K] -> the stored tensors' rows, through ``call(op, *args)`` (a dispatcher's ops)."""
        raise self._unsupported("quantizer")

    def dequantize(self, call: Callable[..., Any], *tensors: torch.Tensor) -> torch.Tensor:
        """:meth:`quantize`'s output -> float32 [r, K], through ``call``."""
        raise self._unsupported("dequantizer")

    def uses_rule(self, scale_fmt: str | None) -> bool:
        """Whether an E8M0 scale rule decides this target's bytes."""
        return self.weight_scale is not None and self.weight_scale.e8m0

    def qconfig(self, scale_fmt: str | None, kept: list[str], unquantized: list[str], fused: bool) -> dict | None:
        """config.json's ``quantization_config`` for this target; ``kept``: projections left unquantized
        (--ignore), ``unquantized``: every Linear module left so; ``fused``: GPT-OSS fused experts present."""
        raise self._unsupported("quantization_config")


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} registered twice")
    FORMATS[fmt.name] = fmt
    return fmt


def get(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; known: {', '.join(FORMATS)}") from None


def act_formats() -> tuple[str, ...]:
    """Formats whose GEMM quantizes activations (the fused activation-quantization ops' and fused MoE's)."""
    return tuple(n for n, f in FORMATS.items() if f.act_scale is not None)


def convert_targets() -> list[str]:
    """``quantkit convert --to`` choices: the quantized targets, then the plain ones."""
    return [n for n, f in sorted(FORMATS.items(), key=lambda nf: nf[1].scale_suffix is None) if f.convert_to]


def reference(op: str) -> Callable[..., Any] | None:
    """The pure-torch function of a dispatcher op some format defines (its ``references`` or its GEMM)."""
    for f in FORMATS.values():
        if op in f.references:
            return f.references[op]
        if op == f.gemm_op:
            return f.gemm_ref
    return None


def _ct_args(dynamic: bool, bits: int) -> dict:
    return {
        "num_bits": bits, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
        "dynamic": dynamic, "scale_dtype": "torch.uint8", "zp_dtype": None, "actorder": None,
        "block_structure": None, "observer": None if dynamic else "memoryless_minmax", "observer_kwargs": {},
    }


def compressed_tensors(fmt: str, bits: int, quantized_acts: bool, ignore: list[str]) -> dict:
    """A compressed-tensors ``quantization_config`` (llm-compressor's MX schemes): Linear weights ``bits``-bit float,
    group 32, symmetric, static, uint8 (E8M0) scales; input activations the same but dynamic, or none (A16);
    ``ignore`` lists every Linear module left unquantized."""
    group = {"targets": ["Linear"], "format": fmt, "weights": _ct_args(False, bits),
             "input_activations": _ct_args(True, 8) if quantized_acts else None, "output_activations": None}
    return {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "config_groups": {"group_0": group}, "ignore": ignore, "kv_cache_scheme": None,
        "sparsity_config": {}, "transform_config": {},
    }


class Bf16(Format):
    """Plain BF16 weights: unquantized, the ``convert --to bf16`` target (written by the converters' own path)."""

    name = "bf16"
    description = "plain BF16 weights"
    is_target = True
    convert_to = True

    def qconfig(self, scale_fmt: str | None, kept: list[str], unquantized: list[str], fused: bool) -> dict | None:
        return None
