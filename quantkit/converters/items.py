"""Conversion items: one logical output tensor, where its values live in the source, and what the
family says about it.  Family modules build them through :class:`Expect`, which checks every
source tensor against the shape the config implies and the dtype its format needs.

Logical orientation: a projection is [*lead, N(out), K(in)] whatever the source stores
(transformers' BF16 GPT-OSS experts are [E, K, N] on disk: ``transposed``).

Source kinds:
  * ``plain``     one float tensor (BF16/F16/F32), optionally a row window (GPT-OSS ``original/``
                  ``attn.qkv`` holds q|k|v rows);
  * ``fp8-block``   ``<w>`` F8_E4M3 [*, N, K] + ``<w>_scale_inv`` [*, ceil(N/128), ceil(K/128)]
                    (F32, BF16/F16 as some releases store it, or E8M0 bytes; compressed-tensors: ``weight_scale``);
  * ``fp8-channel`` compressed-tensors FP8 / FP8_DYNAMIC: F8_E4M3 [N, K] + ``weight_scale`` [N, 1] or [1];
  * ``mxfp8``       F8_E4M3 [*, N, K] + U8 E8M0 scales [*, N, K/32] (compressed-tensors, quantkit's mxfp8);
  * ``mxfp4``       ``<p>_blocks`` U8 [*, N, K/32, 16] + ``<p>_scales`` U8 [*, N, K/32] (GPT-OSS), or
                    compressed-tensors ``weight_packed`` U8 [N, K/2] + ``weight_scale`` U8 [N, K/32] (the same bytes).

Which layout a Linear module has comes from the source's quantization_config (:mod:`.qsource`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from ..checkpoint import CheckpointError, TensorInfo
from ..families import Family, is_quantized_weight
from .qsource import Stored, SourceScheme

FLOATS = ("BF16", "F16", "F32")
SCALES = ("F32", "BF16", "F16", "U8", "F8_E8M0")
BYTES = ("U8", "F8_E8M0")
TILE = 128
MX = 32

# roles: what quantized targets do with an item, and whether it is a Linear module
LINEAR = "linear"  # a projection the family quantizes (families.is_quantized_weight)
MODULE = "module"  # a Linear module kept in source precision (router, lm_head, MTP eh_proj)
TENSOR = "tensor"  # embeddings, norms, biases, sinks


@dataclass(frozen=True)
class Source:
    kind: str  # "plain" | "fp8-block" | "fp8-channel" | "mxfp8" | "mxfp4"
    tensors: tuple[str, ...]  # the weight (or blocks) first, then its scale
    dtype: str  # plain: its dtype tag; else the scale's dtype tag
    rows: tuple[int, int] | None = None
    transposed: bool = False


@dataclass(frozen=True)
class Item:
    name: str  # HF root output name
    shape: tuple[int, ...]  # logical shape
    source: Source
    role: str
    fused: bool = False  # GPT-OSS fused experts: BF16 on disk is [E, K, N] (transformers' layout)

    @property
    def module(self) -> str:
        return self.name.removesuffix(".weight")

    def matches(self, pattern: str) -> bool:
        return fnmatch.fnmatchcase(self.name, pattern) or fnmatch.fnmatchcase(self.module, pattern)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Expect:
    """Collects the items of one checkpoint and checks each source tensor as it is named."""

    def __init__(self, family: Family, tensors: dict[str, TensorInfo], config: dict, where: str) -> None:
        self.family = family
        self.tensors = tensors
        self.where = where
        self.scheme = SourceScheme(config, where)  # how each Linear module is stored
        self.items: list[Item] = []
        self.used: set[str] = set()

    def _info(self, name: str, what: str) -> TensorInfo:
        t = self.tensors.get(name)
        if t is None:
            raise CheckpointError(f"{self.where}: tensor {name!r} ({what}) is missing")
        self.used.add(name)
        return t

    def _check(self, t: TensorInfo, shape: tuple[int, ...], dtypes: tuple[str, ...], what: str) -> None:
        if t.dtype not in dtypes:
            raise CheckpointError(f"{self.where}: tensor {t.name!r} ({what}) is {t.dtype}; expected {' or '.join(dtypes)}")
        if t.shape != shape:
            raise CheckpointError(f"{self.where}: tensor {t.name!r} ({what}) has shape {list(t.shape)}; the config implies {list(shape)}")

    def has(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, src: str, shape: tuple[int, ...], out: str | None = None,
               rows: tuple[int, int] | None = None, total_rows: int | None = None) -> Item:
        """A float tensor kept in its own dtype (norms, biases, embeddings, sinks).

        ``rows``/``total_rows``: the item is rows [a, b) of a source with ``total_rows`` rows."""
        return self._plain(src, shape, out or src, TENSOR, rows, total_rows, "float tensor")

    def linear(self, src: str, shape: tuple[int, ...], out: str | None = None,
               rows: tuple[int, int] | None = None, total_rows: int | None = None) -> Item:
        """A Linear weight [N, K]: plain, or FP8 with its block scales when the source is FP8.

        Whether quantized targets quantize it is the family's rule (families.is_quantized_weight)."""
        out = out or src
        role = LINEAR if is_quantized_weight(self.family, out) else MODULE
        stored = self.scheme.stored(src.removesuffix(".weight"), role == LINEAR) if rows is None else None
        if stored is not None and stored.kind != "plain":
            return self._stored(src.removesuffix(".weight"), shape, out, role, stored)
        if rows is None and role == MODULE and self._stored_fp8(src):
            return self._scaled(src, src + "_scale_inv", shape, out, role, "fp8-block")
        return self._plain(src, shape, out, role, rows, total_rows, "projection weight")

    def _plain(self, src: str, shape: tuple[int, ...], out: str, role: str, rows: tuple[int, int] | None,
               total_rows: int | None, what: str) -> Item:
        t = self._info(src, what)
        full = shape if rows is None else (total_rows or 0,) + shape[1:]
        self._check(t, full, FLOATS, what)
        if rows is not None and (rows[1] - rows[0] != shape[0] or rows[1] > full[0]):
            raise CheckpointError(f"{self.where}: rows {list(rows)} of {src!r} do not give {list(shape)}")
        return self._add(Item(out, shape, Source("plain", (src,), t.dtype, rows=rows), role))

    def _stored_fp8(self, src: str) -> bool:
        """A module the family keeps in source precision, stored as FP8 with its block scale anyway (some
        DeepSeek-V3 files hold MTP ``eh_proj`` so): it is dequantized to BF16 by the 128x128 block rule."""
        t = self.tensors.get(src)
        return t is not None and t.dtype == "F8_E4M3" and src + "_scale_inv" in self.tensors

    def _scaled(self, wname: str, sname: str, shape: tuple[int, ...], out: str, role: str, kind: str, fused: bool = False) -> Item:
        """A quantized weight ``wname`` with its scale ``sname``, checked against ``shape`` [*, N, K] and ``kind``."""
        what = f"{kind} weight (quantization_config {self.scheme.method})" if not fused else f"{kind} expert weight"
        *lead, n, k = shape
        if kind in ("mxfp8", "mxfp4") and k % MX:
            raise CheckpointError(f"{self.where}: {out!r} has K={k}, not a multiple of {MX}: no {kind} layout exists")
        stored = (*lead, n, k // 2) if kind == "mxfp4" else shape
        self._check(self._info(wname, what), stored, ("U8",) if kind == "mxfp4" else ("F8_E4M3",), what)
        if sname not in self.tensors:
            what = "block scale" if kind == "fp8-block" else "scale"
            raise CheckpointError(f"{self.where}: {kind} weight {wname!r} has no {what} {sname!r}")
        s = self._info(sname, f"{kind} scale")
        want = {"fp8-block": (*lead, cdiv(n, TILE), cdiv(k, TILE)), "fp8-channel": (n, 1)}.get(kind, (*lead, n, k // MX))
        if kind == "fp8-channel" and s.shape in ((1,), ()):
            want = s.shape  # one scale for the tensor (compressed-tensors FP8)
        label = {"fp8-block": "128x128 block", "fp8-channel": "per-channel FP8"}.get(kind, "E8M0 1x32")
        self._check(s, want, SCALES if kind.startswith("fp8") else BYTES, f"{label} scale of {list(shape)}")
        return self._add(Item(out, shape, Source(kind, (wname, sname), s.dtype), role, fused=fused))

    def _stored(self, module: str, shape: tuple[int, ...], out: str, role: str, st: Stored) -> Item:
        """A Linear module stored as its quantization_config says (:mod:`.qsource`)."""
        for extra in st.dropped:  # read past: targets quantize activations dynamically
            if f"{module}.{extra}" in self.tensors:
                self._info(f"{module}.{extra}", "static activation scale")
        return self._scaled(f"{module}.{st.weight}", f"{module}.{st.scale}", shape, out, role, st.kind)

    def fused_scaled(self, src: str, shape: tuple[int, ...], out: str) -> Item:
        """quantkit's fp8-block / mxfp8 GPT-OSS experts: F8 [E, N, K] + ``_scale_inv`` F32 tiles or ``_scale`` U8 [E, N, K/32]."""
        if src + "_scale_inv" in self.tensors:
            return self._scaled(src, src + "_scale_inv", shape, out, LINEAR, "fp8-block", fused=True)
        return self._scaled(src, src + "_scale", shape, out, LINEAR, "mxfp8", fused=True)

    def mxfp4(self, blocks: str, scales: str, shape: tuple[int, ...], out: str) -> Item:
        """GPT-OSS MXFP4 experts: logical [E, N, K] from blocks [E, N, K/32, 16] and scales [E, N, K/32]."""
        if shape[-1] % MX:
            raise CheckpointError(f"{self.where}: {out!r} has K={shape[-1]}, not a multiple of {MX}: no MXFP4 layout exists")
        g = shape[:-1] + (shape[-1] // MX,)
        self._check(self._info(blocks, "MXFP4 blocks"), g + (MX // 2,), ("U8",), "MXFP4 blocks")
        self._check(self._info(scales, "MXFP4 scales"), g, BYTES, "MXFP4 E8M0 scales")
        return self._add(Item(out, shape, Source("mxfp4", (blocks, scales), "U8"), LINEAR, fused=True))

    def stacked(self, src: str, shape: tuple[int, ...], out: str) -> Item:
        """transformers' BF16 GPT-OSS experts: [E, K, N] on disk, logical [E, N, K]."""
        t = self._info(src, "stacked expert weight")
        self._check(t, shape[:-2] + (shape[-1], shape[-2]), FLOATS, "stacked expert weight [E, in, out]")
        return self._add(Item(out, shape, Source("plain", (src,), t.dtype, transposed=True), LINEAR, fused=True))

    def _add(self, item: Item) -> Item:
        self.items.append(item)
        return item

    def finish(self) -> list[Item]:
        extra = sorted(set(self.tensors) - self.used)
        if extra:
            more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
            raise CheckpointError(f"{self.where}: unexpected tensors no rule of this family covers: {', '.join(extra[:5])}{more}")
        return self.items
