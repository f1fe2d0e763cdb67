"""Which kernel runs a GEMM: :func:`select_fp8_block` and :func:`select_mxfp8` (pure functions of the target, shape,
output dtype and backend asked for) return the leaf and its launch; nothing below them chooses again.  The rule: the
first row of the device's table (:mod:`.tables`) that holds (M, K) and whose kernel can run the call.

| leaf            | kernel                                                                  |
|-----------------|-------------------------------------------------------------------------|
| triton.skinny   | :mod:`.skinny`: small M, the weight streamed once, split-K over every SM |
| triton.wgmma    | :mod:`.wgmma`: warp-specialised Gluon kernel (sm_90)                     |
| triton.tiled    | :mod:`.block_scaled`: tiled Triton kernel, any device                    |
| deepgemm        | :mod:`.deepgemm`: DeepGEMM's kernel (sm_90, FP8-block)                   |
| dequant-bf16    | :mod:`.mxfp8`: both operands to bf16 (exact), one cuBLAS GEMM (MXFP8)      |

``auto`` (which resolves to the ``triton`` backend where Triton is compiled) may run every leaf; an explicit ``triton``
the Triton leaves only; ``deepgemm`` / ``dequant-bf16`` their own.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .. import dispatch
from ..dispatch import AUTO, Choice, MapRow, Target
from ..triton_numerics import PRIORITY, available, cdiv
from . import deepgemm, fp8_block, mxfp8, tables, wgmma
from .block_scaled import INT32_LIMIT, Config, tma_ok
from .skinny import SkinnyConfig
from .tables import Row


def has(t: Target, name: str) -> bool:
    """Whether "deepgemm" / "wgmma" runs on t: probed for a device (:func:`device_target`), listed by a named target, or
    asked of this process's current CUDA device for a bare device target (``quantkit kernels --device cuda``)."""
    if t.optional is not None:
        return name in t.optional
    if t.type != "cuda":
        return False
    device = torch.device("cuda")
    return deepgemm.available_cached(device).ok if name == "deepgemm" else _wgmma_ok(device)


def device_target(device: torch.device) -> Target:
    """The device's :class:`Target` with its optional kernels probed."""
    return _probed(dispatch.target(device), deepgemm.available_cached(device).ok, _wgmma_ok(device))


@functools.cache  # the capability, Gluon and the interpreter do not change within a process (DeepGEMM can: disable())
def _wgmma_ok(device: torch.device) -> bool:
    return wgmma.wgmma_available(device).ok


@functools.cache
def _probed(t: Target, dg: bool, wg: bool) -> Target:
    return replace(t, optional=frozenset(name for name, ok in (("deepgemm", dg), ("wgmma", wg)) if ok))


def _table(by_kind: dict[str, tuple[Row, ...]], t: Target) -> tuple[Row, ...]:
    return by_kind["sm90"] if "sm90" in by_kind and t.type == "cuda" and t.capability[0] == 9 else by_kind["any"]


OTHER_BACKEND = "not the backend asked for"
NO_DEEPGEMM = "DeepGEMM is not available here"
NO_WGMMA = "the wgmma kernel needs compiled sm_90 with Gluon"


def deepgemm_why_not(t: Target, n: int, k: int, out_dtype: torch.dtype) -> str | None:
    if not has(t, "deepgemm"):
        return NO_DEEPGEMM
    if n % 8 or k % 16:
        return "DeepGEMM's TMA needs N % 8 == 0 and K % 16 == 0"
    if out_dtype != torch.bfloat16:
        return "DeepGEMM writes bf16 only"
    return None


def wgmma_why_not(t: Target, m: int, n: int, k: int, out_dtype: torch.dtype, aligned: bool) -> str | None:
    if not has(t, "wgmma"):
        return NO_WGMMA
    if out_dtype not in wgmma.OUT_DTYPES:
        return f"the wgmma kernel writes {wgmma.OUT_DTYPES} only"
    if not aligned:
        return "TMA needs 16-byte aligned E4M3 rows"
    if m * n >= INT32_LIMIT:
        return "the output overflows 32-bit offsets"
    if m <= 64 and k > 4096 and (cdiv(n, wgmma.BLOCK_N) < 48 or k >= 16384):
        return "few 128x128 tiles each walk a long K at M <= 64; the small-M kernel splits K over every SM"
    return None


def _why_not(row: Row, t: Target, m: int, n: int, k: int, out_dtype: torch.dtype, backend: str, aligned: bool) -> str | None:
    if backend != AUTO and row.kernel.split(".")[0] != backend:
        return OTHER_BACKEND
    if row.kernel == "deepgemm":
        return deepgemm_why_not(t, n, k, out_dtype)
    if row.kernel == "triton.wgmma":
        return wgmma_why_not(t, m, n, k, out_dtype, aligned)
    return None


def _first(op: str, table: tuple[Row, ...], t: Target, m: int, n: int, k: int, out_dtype: torch.dtype, backend: str, aligned: bool) -> Choice:
    """The first row that holds (M, K) and runs, naming the first row a rule of the call passed over."""
    passed = ""
    for row in tables.rows(m, k, table):
        why = _why_not(row, t, m, n, k, out_dtype, backend, aligned)
        if why is None:
            return _leaf(row.kernel, row.config, row.reason + passed, t, m, n, k, out_dtype, aligned)
        if not passed and why not in (OTHER_BACKEND, NO_DEEPGEMM, NO_WGMMA):
            passed = f" (not {row.kernel}: {why})"
    raise ValueError(f"{op}: no {backend} kernel for M={m} N={n} K={k} on {t.name}")


def _leaf(kernel: str, config: Any, reason: str, t: Target, m: int, n: int, k: int, out_dtype: torch.dtype, aligned: bool) -> Choice:
    """The row's kernel with its launch for this shape."""
    if kernel == "triton.wgmma":
        config = wgmma.resolve(config, m, n, k, t.sms, out_dtype.itemsize)
    elif kernel == "deepgemm":
        config = deepgemm.config_for(m, n, k, t.sms)
    elif isinstance(config, Config) and config.tma and not aligned:
        config, reason = replace(config, tma=False, persistent=0), reason + "; pointer loads: rows not 16-byte aligned"
    return Choice(kernel, config, reason)


def select_fp8_block(t: Target, m: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16, backend: str = AUTO,
                     aligned: bool | None = None) -> Choice:  # fmt: skip
    """The leaf of an [M, K] x [N, K] ``gemm_fp8_block`` on t; ``aligned``: TMA can read both operands (None: K %
    16 == 0, as for contiguous tensors)."""
    aligned = k % 16 == 0 if aligned is None else aligned
    if backend == "deepgemm":
        return _leaf("deepgemm", None, "DeepGEMM asked for", t, m, n, k, out_dtype, aligned)
    return _first("gemm_fp8_block", _table(tables.FP8_BLOCK, t), t, m, n, k, out_dtype, backend, aligned)


def select_mxfp8(t: Target, m: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16, backend: str = AUTO,
                 aligned: bool | None = None) -> Choice:  # fmt: skip
    """The leaf an [M, K] x [N, K] ``gemm_mxfp8`` runs on t (``aligned`` as for :func:`select_fp8_block`)."""
    aligned = k % 16 == 0 if aligned is None else aligned
    if backend == "dequant-bf16":
        return Choice("dequant-bf16", None, "dequant-bf16 asked for")
    return _first("gemm_mxfp8", _table(tables.MXFP8, t), t, m, n, k, out_dtype, backend, aligned)


# ---- the op's tensors -> the Choice ----


def _bind(fn: Callable[..., Any], **bound: Any) -> Callable[..., Any]:
    return lambda *args, **kwargs: fn(*args, **{**kwargs, **bound})


def _given(config: Any, t: Target, m: int, n: int, k: int, out_dtype: torch.dtype) -> tuple[str, Any]:
    if isinstance(config, wgmma.WgmmaConfig):
        return "triton.wgmma", wgmma.resolve(config, m, n, k, t.sms, out_dtype.itemsize)
    return ("triton.skinny" if isinstance(config, SkinnyConfig) else "triton.tiled"), config


def _triton_only(backend: str, op: str) -> None:
    if backend not in (AUTO, "triton"):
        raise ValueError(f"{op}: a launch config is for the Triton kernels, not backend {backend!r}")


def _shape(a: torch.Tensor, w: torch.Tensor) -> tuple[int, int, int, bool]:
    """(M, N, K, TMA can read both operands' rows) of the op's 2-D views."""
    a2 = a if a.dim() == 2 else a.reshape(-1, a.shape[-1])
    return math.prod(a.shape[:-1]), w.shape[0], w.shape[-1], tma_ok(a2, w)


def choose_fp8_block(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16, *, config=None, workspace=None,
                     backend: str = AUTO) -> Choice:  # fmt: skip
    t = device_target(a.device)
    m, n, k, aligned = _shape(a, w)
    if config is not None:  # checked by the kernel
        _triton_only(backend, "gemm_fp8_block")
        kernel, config = _given(config, t, m, n, k, out_dtype)
        return Choice(kernel, config, "the caller's config", _bind(fp8_block.gemm_fp8_block, config=config))
    return _bound_fp8_block(t, m, n, k, out_dtype, backend, aligned)


@functools.lru_cache(maxsize=4096)  # every eager GEMM call asks: the choice with its leaf bound, once per shape
def _bound_fp8_block(t: Target, m: int, n: int, k: int, out_dtype: torch.dtype, backend: str, aligned: bool) -> Choice:
    c = select_fp8_block(t, m, n, k, out_dtype, backend, aligned)
    if c.kernel == "deepgemm":
        return replace(c, run=_deepgemm if backend == "deepgemm" else _deepgemm_or_triton)
    return replace(c, run=_bind(fp8_block.gemm_fp8_block, config=c.config, checked=True))


def _deepgemm(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16, *, workspace=None):
    return deepgemm.gemm_fp8_block_deepgemm(a, a_scale, w, w_scale, bias, out_dtype)


def _deepgemm_or_triton(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16, *, workspace=None):
    """auto's DeepGEMM leaf: where nvcc cannot build the kernel, DeepGEMM is switched off on the device and the
    Triton selection runs, with a warning."""
    try:
        return deepgemm.gemm_fp8_block_deepgemm(a, a_scale, w, w_scale, bias, out_dtype)
    except deepgemm.BuildError as err:
        why = str(err).splitlines()[0]
        deepgemm.disable(a.device, why)
        warnings.warn(f"gemm_fp8_block: DeepGEMM disabled on {a.device}, running Triton ({why})", stacklevel=2)
    c = choose_fp8_block(a, a_scale, w, w_scale, bias, out_dtype, backend="triton")
    return c.run(a, a_scale, w, w_scale, bias, out_dtype, workspace=workspace)


def choose_mxfp8(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16, *, config=None, workspace=None,
                 backend: str = AUTO) -> Choice:  # fmt: skip
    t = device_target(a.device)
    m, n, k, aligned = _shape(a, w)
    if config is not None:
        _triton_only(backend, "gemm_mxfp8")
        kernel, config = _given(config, t, m, n, k, out_dtype)
        return Choice(kernel, config, "the caller's config", _bind(mxfp8.gemm_mxfp8, config=config))
    return _bound_mxfp8(t, m, n, k, out_dtype, backend, aligned)


@functools.lru_cache(maxsize=4096)
def _bound_mxfp8(t: Target, m: int, n: int, k: int, out_dtype: torch.dtype, backend: str, aligned: bool) -> Choice:
    c = select_mxfp8(t, m, n, k, out_dtype, backend, aligned)
    if c.kernel == "dequant-bf16":
        return replace(c, run=_dequant_bf16)
    return replace(c, run=_bind(mxfp8.gemm_mxfp8, config=c.config))


def _dequant_bf16(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16, *, workspace=None):
    return mxfp8.gemm_mxfp8_bf16(a, a_scale, w, w_scale, bias, out_dtype)


def deepgemm_jobs(shapes, device: torch.device) -> set[tuple[int, int, deepgemm.Config]]:
    """(N, K, config) of every DeepGEMM kernel auto runs on ``device`` for these [N, K] weights, for
    :func:`.deepgemm.prebuild`."""
    t = device_target(device)
    top = max((r.m_max for r in _table(tables.FP8_BLOCK, t) if r.kernel == "deepgemm"), default=0)
    jobs = set()
    for n, k in set(shapes):
        for m in range(1, top + 1):
            c = select_fp8_block(t, m, n, k)
            if c.kernel == "deepgemm":
                jobs.add((n, k, c.config))
    return jobs


# ---- the kernel map ----

MAP_SHAPES: tuple[tuple[str, int, int], ...] = (  # (projection, N, K) of dense linears; q, k, v run as one GEMM
    ("gpt-oss-20b qkv", 5120, 2880),
    ("gpt-oss-20b o", 2880, 4096),
    ("qwen3-30b-a3b qkv", 5120, 2048),
    ("qwen3-30b-a3b o", 2048, 4096),
    ("deepseek-v3 q_a+kv_a", 2112, 7168),
    ("deepseek-v3 q_b", 24576, 1536),
    ("deepseek-v3 o", 7168, 16384),  # MLA multiplies kv_b dequantized
    ("deepseek-v3 dense gate_up", 36864, 7168),
    ("deepseek-v3 dense down", 7168, 18432),
    ("deepseek-v3 shared gate_up", 4096, 7168),
    ("deepseek-v3 shared down", 7168, 2048),
)
MAP_MS = (1, 8, 32, 64, 128, 256, 1024, 8192)


def _map(op: str, fmt: str, select: Callable[..., Choice]) -> Callable[[Target], list[MapRow]]:
    def rows(t: Target) -> list[MapRow]:
        if t.type != "cuda":
            return [MapRow(op, f"{fmt} any shape", "any", Choice(dispatch.REFERENCE, reason="auto runs compiled Triton on CUDA only"))]
        return [MapRow(op, f"{fmt} {name} [{n}, {k}]", str(m), select(t, m, n, k)) for name, n, k in MAP_SHAPES for m in MAP_MS]

    return rows


def _explicit(device: torch.device) -> dispatch.Availability:
    why = available(device)
    return dispatch.Availability(why.ok, auto=False, reason=why.reason or "explicit; auto runs it through gemm_mxfp8's selection")


def _register() -> None:
    for op, choose, fn, alt, alt_available, alt_priority in (
        ("gemm_fp8_block", choose_fp8_block, fp8_block.gemm_fp8_block, "deepgemm", deepgemm.available_cached, deepgemm.PRIORITY),
        ("gemm_mxfp8", choose_mxfp8, mxfp8.gemm_mxfp8, "dequant-bf16", _explicit, PRIORITY - 1),
    ):
        dispatch.register(op, "triton", fn, available=available, priority=PRIORITY, select=functools.partial(choose, backend="triton"),
                          auto_select=functools.partial(choose, backend=AUTO))  # fmt: skip
        run = {"deepgemm": _deepgemm, "dequant-bf16": _dequant_bf16}[alt]
        dispatch.register(op, alt, run, available=alt_available, priority=alt_priority, select=functools.partial(choose, backend=alt))
    dispatch.register_map("gemm_fp8_block", _map("gemm_fp8_block", "fp8-block", select_fp8_block))
    dispatch.register_map("gemm_mxfp8", _map("gemm_mxfp8", "mxfp8", select_mxfp8))


_register()
