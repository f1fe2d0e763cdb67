"""``quantkit inspect``: what a checkpoint is (family, formats, sizes) and what is wrong with it.

Formats are named as ``convert --to`` names them.  A linear weight's format is read off its
tensors, not its config: ``*_blocks`` + ``*_scales`` U8 is mxfp4 (GPT-OSS), as is compressed-tensors'
``weight_packed`` + U8 ``weight_scale``; an F8_E4M3 ``weight`` with an F32 ``weight_scale_inv``
(or compressed-tensors' float ``weight_scale``) tile grid is fp8-block (fp8-block-ue8m0 when every
scale is a power of two); with a U8 ``weight_scale`` [N, K/32] it is mxfp8; with a float
``weight_scale`` [N, 1] or [1] it is fp8-channel / fp8-tensor (compressed-tensors FP8_DYNAMIC / FP8,
whose static ``input_scale`` is an activation scale); a 16/32-bit float weight is bf16/f16/f32.
Warnings (:mod:`.consumers`) say where a known consumer will refuse a checkpoint that is valid here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from . import consumers, families, finite, modelconfig, modelshapes
from .checkpoint import Checkpoint, CheckpointError, TensorInfo
from .formats import fp8_block

SCALE_SUFFIXES = ("_scale_inv", "_scale", "_scales", ".scales")
# MXFP4 blocks/scales suffix pairs: HF root layout, OpenAI's original/ layout, compressed-tensors
MX_PAIRS = (("_blocks", "_scales"), (".blocks", ".scales"), (".weight_packed", ".weight_scale"))
ACT_SCALES = (".input_scale", ".output_scale", ".k_scale", ".v_scale")  # activation / KV scales: no weight of their own


@dataclass
class Report:
    path: str
    layout: str
    family: str | None
    quantization_config: dict | None
    formats: dict[str, int] = field(default_factory=dict)
    parameters: int = 0
    bytes_per_dtype: dict[str, int] = field(default_factory=dict)
    shards: int = 0
    quantized: int = 0
    unquantized: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tensors: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _scale_of(ck: Checkpoint, base: str) -> TensorInfo | None:
    for suf in ("_scale_inv", "_scale"):
        if base + suf in ck:
            return ck.info(base + suf)
    return None


def _classify(ck: Checkpoint, t: TensorInfo, problems: list[str]) -> str | None:
    """Format of weight tensor ``t`` (None for a scale tensor); appends what is wrong."""
    n = t.name
    for blk, sc in MX_PAIRS:
        if n.endswith(sc) and n[: -len(sc)] + blk in ck:
            return None
        if n.endswith(blk):
            return _check_mxfp4(ck, t, blk, sc, problems)
    if n.endswith(ACT_SCALES):
        return None
    if n.endswith(SCALE_SUFFIXES):
        base = n.rsplit("_scale", 1)[0]
        if base not in ck and base + "_blocks" not in ck:
            problems.append(f"{n}: scale without its weight {base}")
        return None
    if t.dtype == "F8_E4M3":
        return _check_fp8(ck, t, problems)
    return {"BF16": "bf16", "F16": "f16", "F32": "f32"}.get(t.dtype, t.dtype.lower())


def _check_mxfp4(ck: Checkpoint, t: TensorInfo, blk: str, sc: str, problems: list[str]) -> str:
    s = t.name[: -len(blk)] + sc
    packed = blk == ".weight_packed"  # compressed-tensors: [N, K/2] bytes, scales [N, K/32]
    want = (*t.shape[:-1], t.shape[-1] // 16) if packed else t.shape[:-1]
    if s not in ck:
        problems.append(f"{t.name}: MXFP4 blocks without {s}")
    elif (not packed and t.shape[-1] != 16) or (packed and t.shape[-1] % 16) or ck.info(s).shape != want:
        layout = "[..., K/2] / [..., K/32]" if packed else "[..., G, 16] / [..., G]"
        problems.append(f"{s}: shape {list(ck.info(s).shape)} does not match blocks {list(t.shape)} ({layout})")
    return "mxfp4"


def _check_fp8(ck: Checkpoint, t: TensorInfo, problems: list[str]) -> str:
    s = _scale_of(ck, t.name)
    if s is None:
        problems.append(f"{t.name}: F8_E4M3 weight without a weight_scale_inv / weight_scale tensor")
        return "fp8-unscaled"
    *lead, n, k = t.shape
    if s.dtype == "U8":
        if k % 32:
            problems.append(f"{t.name}: MX tensor with K={k}, not a multiple of 32")
        elif list(s.shape) != [*lead, n, k // 32]:
            problems.append(f"{s.name}: shape {list(s.shape)} disagrees with weight {list(t.shape)} (want {[*lead, n, k // 32]})")
        return "mxfp8"
    want = [*lead, _ceil(n, 128), _ceil(k, 128)]
    if list(s.shape) != want and not lead and list(s.shape) in ([n, 1], [1], []):  # compressed-tensors FP8_DYNAMIC / FP8
        return "fp8-channel" if list(s.shape) == [n, 1] else "fp8-tensor"
    if list(s.shape) != want:
        problems.append(f"{s.name}: shape {list(s.shape)} disagrees with weight {list(t.shape)} (want {want} for 128x128 tiles)")
        return "fp8-block"
    return "fp8-block-ue8m0" if fp8_block.is_pow2_scale(ck.get(s.name)) else "fp8-block"


def _params(t: TensorInfo) -> int:
    if t.name.endswith(SCALE_SUFFIXES):
        return 0
    return t.numel * 2 if t.name.endswith(("_blocks", ".blocks", ".weight_packed")) else t.numel


def _check_config(ck: Checkpoint, problems: list[str]) -> str | None:
    """The family (None when unknown); what the config gets wrong, or disagrees with in the tensors."""
    where = str(ck.root / "config.json")
    try:
        family = families.detect(ck.config, where).name
    except ValueError as e:
        problems.append(str(e))
        return None
    try:
        mc = modelconfig.read(ck.config, where)
    except CheckpointError as e:
        problems.append(str(e))
        return family
    problems.extend(modelshapes.summarize(modelshapes.problems(mc, ck)))
    return family


def _scale_values(name: str, s: torch.Tensor, w: torch.Tensor) -> list[str]:
    """Negative 128x128 block scales, and zero ones on a tile that is not all zero (an all-zero tile with
    scale 0 is a valid encoding: any scale gives zero)."""
    s = s.float()
    out = []
    if (neg := s < 0).any():
        out.append(f"{name}: {int(neg.sum())} negative block scales, the first at {neg.nonzero()[0].tolist()}")
    bad = []
    for i in (s == 0).nonzero().tolist():
        *lead, r, c = i
        tile = w[tuple(lead)][r * 128 : (r + 1) * 128, c * 128 : (c + 1) * 128]
        if ((tile.view(torch.uint8) & 0x7F) != 0).any():  # E4M3 +-0 are 0x00 and 0x80
            bad.append(i)
    if bad:
        out.append(f"{name}: {len(bad)} zero block scales on tiles that are not all zero (their values are lost), the first at {bad[0]}")
    return out


def _tile_grid(shape: tuple[int, ...]) -> list[int]:
    *lead, n, k = shape
    return [*lead, _ceil(n, 128), _ceil(k, 128)]


def value_problems(ck: Checkpoint) -> list[str]:
    """Non-finite values of every tensor (quantkit/finite.py) and suspicious FP8 block scales, read
    through zero-copy maps of the shards, a chunk at a time."""
    from .converters.source import Reader, locations

    reader = Reader(locations(ck, set(ck.names())))
    out = []
    for t in ck.tensors.values():
        v = reader.view(t.name)
        bad = finite.scan(t.name, v, finite.code_of(t.dtype, e8m0_bytes=t.name.endswith(SCALE_SUFFIXES)))
        if bad is not None:
            out.append(bad.message())
        w = ck.tensors.get(t.name.rsplit("_scale", 1)[0]) if t.name.endswith(("_scale_inv", "_scale")) else None
        if w is not None and w.dtype == "F8_E4M3" and t.dtype in finite.FLOATS and list(t.shape) == _tile_grid(w.shape):
            out += _scale_values(t.name, v, reader.view(w.name))
    reader.close()
    return out


def inspect(path: str, tensors: bool = False, values: bool = True) -> Report:
    ck = Checkpoint(path)
    cfg = ck.config
    rep = Report(str(path), ck.layout, None, cfg.get("quantization_config"), shards=len(ck.files()))
    rep.family = _check_config(ck, rep.problems)
    fam = families.FAMILIES[rep.family] if rep.family else None
    fmts: Counter[str] = Counter()
    weights: dict[str, list[TensorInfo]] = {}
    dtypes: Counter[str] = Counter()
    for t in ck.tensors.values():
        dtypes[t.dtype] += t.nbytes
        rep.parameters += _params(t)
        fmt = _classify(ck, t, rep.problems)
        if fmt is None:
            continue
        weights.setdefault(fmt, []).append(t)
        base = t.name.removesuffix("_blocks").removesuffix(".blocks").replace(".weight_packed", ".weight")
        quant = fmt not in ("bf16", "f16", "f32")
        if quant or (fam and families.is_quantized_weight(fam, base)):
            fmts[fmt] += 1
        rep.quantized += quant
        rep.unquantized += not quant
        if tensors:
            rep.tensors.append({"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "format": fmt, "file": t.file})
    rep.problems += [f"side file {s} (convert and shard skip it)" for s in ck.skipped_side_files()]
    rep.warnings = consumers.warnings(ck, rep.family, weights)
    if values:
        rep.problems += value_problems(ck)
    rep.formats = dict(sorted(fmts.items()))
    rep.bytes_per_dtype = dict(sorted(dtypes.items()))
    return rep


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def render(rep: Report) -> str:
    lines = [
        f"# {rep.path}",
        "",
        f"- family: {rep.family or 'unknown'} (layout: {rep.layout})",
        f"- formats of linear weights: {', '.join(f'{k} x{v}' for k, v in rep.formats.items()) or 'none'}",
        f"- quantization_config: {rep.quantization_config}",
        f"- parameters: {rep.parameters:,}",
        f"- shards: {rep.shards}",
        f"- weight tensors: {rep.quantized} quantized, {rep.unquantized} in source precision",
        "- bytes per dtype: " + ", ".join(f"{k} {_gb(v)}" for k, v in rep.bytes_per_dtype.items()),
    ]
    if rep.tensors:
        lines += ["", "| tensor | dtype | shape | format |", "|---|---|---|---|"]
        lines += [f"| {t['name']} | {t['dtype']} | {t['shape']} | {t['format']} |" for t in rep.tensors]
    if rep.warnings:
        lines += ["", f"warnings: {len(rep.warnings)}"] + [f"- {w}" for w in rep.warnings]
    lines += ["", f"problems: {len(rep.problems)}"] + [f"- {p}" for p in rep.problems]
    return "\n".join(lines)
