"""Producing one task's output tensors chunk by chunk, with its fidelity.

Outputs are allocated once (their final size) and filled band by band, so float32 temporaries are
bounded by the chunk size, not the tensor.  Stochastic rounding uses the output tensor's name and
each element's flat index in the output tensor (``Rounding.for_tensor(name).at(offset)``), so bytes
do not depend on chunking, workers or device.  Exact paths round nothing and are verified: an
element that changes is an error, not a statistic.

On a CPU, decoding, FP8-block quantization (nearest) and its dequantization for fidelity work in
buffers reused from chunk to chunk (one :class:`lut.Scratch` each for the decoder and the quantizer,
the fidelity keeps its own), and FP8-block codes are cast straight into the output.  A step's
tensors are therefore valid until the next step: :func:`run_task` uses each chunk before the next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import finite, formats
from ..checkpoint import CheckpointError
from ..formats import exact, fp8_block
from ..formats.lut import Scratch
from ..formats.rounding import NEAREST, Rounding, uniform
from .decode import Decoder, lead, scale_f32
from .fidelity import Fidelity
from .items import TILE, cdiv
from .ops import Ops
from .plan import EXACT_PATHS, Task
from .qconfig import PLAIN
from .source import Reader

COPY_PATHS = ("copy", "copy-fp8-block", "copy-mxfp8", "copy-mxfp4")  # outputs are views of the source, nothing computed
Step = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Context:
    ops: Ops
    rounding: Rounding  # mode and seed; name and offset are set per tensor and chunk
    scale_fmt: str | None
    rule: str
    chunk_elements: int
    tick: Callable[[], None] = lambda: None


def round_bf16(x: torch.Tensor, r: Rounding) -> torch.Tensor:
    """float32 -> bfloat16, ties to even, or stochastically: add a uniform 16-bit integer to the
    float32 bit pattern and truncate (carry probability = the dropped fraction; exact values stay)."""
    if not r.stochastic:
        return x.to(torch.bfloat16)
    bits = x.contiguous().view(torch.int32)
    add = (uniform(r, x.shape, x.device) * 65536).to(torch.int32)
    out = ((bits + add) & ~0xFFFF).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x).to(torch.bfloat16)


def put(dst: torch.Tensor, src: torch.Tensor) -> None:
    """A chunk into its place in a (CPU) output; from a GPU asynchronously into pinned memory
    (:func:`run_task` synchronizes before the output is handed on)."""
    dst.copy_(src, non_blocking=src.device.type != "cpu")


def outputs(task: Task, device: torch.device) -> list[torch.Tensor]:
    """The task's outputs, allocated once at their final size (pinned when a GPU computes them)."""
    pin = device.type == "cuda"
    return [torch.empty(s.shape, dtype=s.dtype, pin_memory=pin) for s in task.outputs]


def bands(extent: int, width: int, chunk: int) -> list[tuple[int, int]]:
    step = max(TILE, (chunk // max(width, 1)) // TILE * TILE)
    return [(a, min(a + step, extent)) for a in range(0, extent, step)]


def copy_task(task: Task, reader: Reader, ctx: Context) -> tuple[dict[str, torch.Tensor], dict]:
    src = task.item.source
    t = reader.view(src.tensors[0])
    if task.path == "copy":
        if src.rows is not None:
            t = t[src.rows[0] : src.rows[1]]
        return {task.outputs[0].name: t}, Fidelity.identical(t.numel()).record("copy", True)
    if task.path in ("copy-mxfp8", "copy-mxfp4"):  # E8M0 bytes as U8, whether stored U8 or F8_E8M0
        w, s = (t.reshape(task.outputs[0].shape), reader.view(src.tensors[1]).view(torch.uint8))  # MXFP4: blocks or packed rows
        numel = 1
        for d in task.item.shape:
            numel *= d
        return {task.outputs[0].name: w, task.outputs[1].name: s}, Fidelity.identical(numel).record(task.path, True)
    s = scale_f32(reader.view(src.tensors[1]))
    if ctx.scale_fmt == "ue8m0" and not fp8_block.is_pow2_scale(s):
        raise CheckpointError(f"{src.tensors[1]}: the source declares scale_fmt ue8m0 but this scale is not a power of two")
    return {task.outputs[0].name: t, task.outputs[1].name: s}, Fidelity.identical(t.numel()).record(task.path, True)


def quant_step(task: Task, dec: Decoder, out: list[torch.Tensor], ctx: Context, r: Rounding, scratch: Scratch | None) -> Step:
    """Rows of the source quantized to the target format (:meth:`quantkit.formats.Format.quantize`), each stored tensor's
    rows put in place (a row of fp8-block's scales covers 128 weight rows), and dequantized for the fidelity."""
    fmt, L, n, k = formats.get(task.target), lead(task.item.shape), *task.item.shape[-2:]
    views = [o.view(L, cdiv(n, rows), -1) for o, rows in zip(out, fmt.row_blocks, strict=True)]  # [L, stored rows, ...]
    scale_fmt = ctx.scale_fmt or "float"

    def step(l: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = dec.rows(l, a, b)
        parts, into = ctx.ops.quantize(fmt, x, scale_fmt, ctx.rule, r.at((l * n + a) * k), views[0][l, a:b], scratch)
        for view, t, rows in zip(views, parts, fmt.row_blocks, strict=True):
            if not into or t is not parts[0]:  # a weight quantized into its output is in place already
                put(view[l, a // rows : cdiv(b, rows)], t.reshape(-(-(b - a) // rows), -1))
        return x, ctx.ops.dequantize(fmt, *parts, scratch=scratch)

    return step


def exact_mx_step(task: Task, dec: Decoder, out: list[torch.Tensor], ops: Ops) -> Step:
    L, (n, k) = lead(task.item.shape), task.item.shape[-2:]
    w, s = out[0].view(L, n, k), out[1].view(L, n, k // 32)

    def step(l: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        enc, sc = dec.raw_rows(l, a, b)
        if dec.kind == "mxfp4":
            q, e = ops.mxfp4_to_mxfp8(enc, sc)
            ref = ops.mxfp4_decode(enc, sc)
        else:
            q, e = exact.fp8_block_pow2_to_mxfp8(enc, sc)
            ref = ops.fp8_dequant(enc, sc)
        put(w[l, a:b], q), put(s[l, a:b], e)
        return ref, ops.mxfp8_dequant(q, e)

    return step


def mx_to_blocks_step(task: Task, dec: Decoder, out: list[torch.Tensor], ctx: Context, r: Rounding, exact_tiles: list[int]) -> Step:
    """MXFP8 -> fp8-block: tiles that can share their largest MX scale keep their values exactly
    (formats.exact.mxfp8_to_fp8_block); the others are requantized as any float source would be.
    ``exact_tiles`` accumulates [exact, all] tile counts."""
    L, (n, k) = lead(task.item.shape), task.item.shape[-2:]
    w, s = out[0].view(L, n, k), out[1].view(L, *out[1].shape[-2:])

    def step(l: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        q, e = dec.raw_rows(l, a, b)
        x = ctx.ops.mxfp8_dequant(q, e)
        qx, sx, ok = exact.mxfp8_to_fp8_block(q, e)
        qr, sr = ctx.ops.fp8_block(x, ctx.scale_fmt or "float", ctx.rule, r.at((l * n + a) * k))
        exact_tiles[0] += int(ok.sum())
        exact_tiles[1] += ok.numel()
        qo = torch.where(fp8_block.expand_tiles(ok, b - a, k), qx.view(torch.uint8), qr.view(torch.uint8)).view(torch.float8_e4m3fn)
        so = torch.where(ok, sx, sr)
        put(w[l, a:b], qo), put(s[l, a // TILE : cdiv(b, TILE)], so)
        return x, ctx.ops.fp8_dequant(qo, so)

    return step


def bf16_step(task: Task, dec: Decoder, out: list[torch.Tensor], r: Rounding) -> Step:
    L, (n, k) = lead(task.item.shape), task.item.shape[-2:]
    if task.transposed_out:  # output [L, K, N]: bands of K, contiguous in the output
        w = out[0].view(L, k, n)

        def step_t(l: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
            x = dec.cols(l, a, b).T.contiguous()
            y = round_bf16(x, r.at((l * k + a) * n))
            put(w[l, a:b], y)
            return x, y

        return step_t
    w = out[0].view(L, n, k)

    def step(l: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = dec.rows(l, a, b)
        y = round_bf16(x, r.at((l * n + a) * k))
        put(w[l, a:b], y)
        return x, y

    return step


def resolve_path(task: Task, dec: Decoder) -> str:
    if task.path != "fp8-block->mxfp8":
        return task.path
    return "fp8-block(ue8m0)->mxfp8" if fp8_block.is_pow2_scale(dec.all_scales()) else "requantize"


def make_step(task: Task, dec: Decoder, out: list[torch.Tensor], ctx: Context, path: str, r: Rounding, tiles: list[int]) -> Step:
    scratch = Scratch() if ctx.ops.device.type == "cpu" else None
    if path in ("mxfp4->mxfp8", "fp8-block(ue8m0)->mxfp8"):
        return exact_mx_step(task, dec, out, ctx.ops)
    if path == "mxfp8->fp8-block":
        return mx_to_blocks_step(task, dec, out, ctx, r, tiles)
    if task.target not in PLAIN:  # a quantized format
        return quant_step(task, dec, out, ctx, r, scratch)
    return bf16_step(task, dec, out, r)


def tiles_record(path: str, exact_path: bool, tiles: list[int]) -> tuple[str, bool]:
    """mxfp8->fp8-block is exact when every tile was: reported as such, else as partly requantized."""
    if path != "mxfp8->fp8-block":
        return path, exact_path
    return (path, True) if tiles[0] == tiles[1] else (f"{path} (partly requantized)", False)


def check_finite(task: Task, reader: Reader) -> None:
    """Refuse a source tensor holding NaN/Inf (or NaN bytes of E4M3 / E8M0): a quantizer would spread
    it over its whole block, and a copy would hand it on unseen (quantkit/finite.py)."""
    src = task.item.source
    # plain: one float tensor; otherwise the weight (E4M3 bytes, or MXFP4 codes: always finite) and its scale
    codes = ("float",) if src.kind == "plain" else (None if src.kind == "mxfp4" else "e4m3", finite.code_of(src.dtype, e8m0_bytes=True))
    for name, code in zip(src.tensors, codes):
        t = reader.view(name)
        if src.kind == "plain" and src.rows is not None:
            t = t[src.rows[0] : src.rows[1]]
        bad = finite.scan(name, t, code)
        if bad is not None:
            raise CheckpointError(f"{bad.message()}: convert refuses non-finite weights and scales "
                                  "(a quantizer spreads one over its whole block); `quantkit inspect` lists them all")


def run_task(task: Task, reader: Reader, ctx: Context, want: bool) -> tuple[dict[str, torch.Tensor], dict | None]:
    """All outputs of ``task`` (name -> tensor) and, when ``want``, its fidelity record."""
    check_finite(task, reader)
    if task.path in COPY_PATHS:
        return copy_task(task, reader, ctx)
    on_cpu = ctx.ops.device.type == "cpu"
    dec = Decoder(reader, task.item, ctx.ops, Scratch() if on_cpu else None)
    path = resolve_path(task, dec)
    exact_path = path in EXACT_PATHS or path == "fp8-block(ue8m0)->mxfp8"
    r = NEAREST if exact_path else ctx.rounding.for_tensor(task.outputs[0].name)
    out = outputs(task, ctx.ops.device)
    tiles = [0, 0]  # mxfp8->fp8-block: exact tiles, all tiles
    step = make_step(task, dec, out, ctx, path, r, tiles)
    fid = Fidelity()
    n, k = task.item.shape[-2:]
    extent, width = (k, n) if task.transposed_out else (n, k)
    for l in range(lead(task.item.shape)):
        for a, b in bands(extent, width, ctx.chunk_elements):
            ref, got = step(l, a, b)
            if want:  # on a GPU: queued kernels, nothing waits until fid.settle()
                fid.add(ref, got)
            ctx.tick()
    if not on_cpu:
        torch.cuda.current_stream(ctx.ops.device).synchronize()  # the non_blocking copies into `out` have landed
    fid.settle()
    if want and exact_path and fid.exact != fid.numel:
        raise CheckpointError(f"{task.item.name}: the exact path {path} changed {fid.numel - fid.exact} of {fid.numel} elements (max abs {fid.max_abs:g})")
    rec = fid.record(*tiles_record(path, exact_path, tiles)) if want else None
    if rec is not None and tiles[1]:
        rec["exact_tiles"] = f"{tiles[0]}/{tiles[1]}"
    return {s.name: t for s, t in zip(task.outputs, out)}, rec
