"""FlashInfer backend of the sink-attention ops (FlashInfer 0.5.x; imported lazily, CUDA only).

FlashInfer's ``BatchAttentionWithAttentionSinkWrapper`` (flashinfer/attention.py) is its paged
prefill wrapper compiled with the ``AttentionSink`` variant (flashinfer/jit/attention/variants.py):
the per-head sink (float32 [Hq]) joins the softmax denominator as exp(sink - m), unscaled;
the softmax scale is a run-time scalar; ``window_left`` = W - 1 keeps keys p-W+1..p.  It runs
as ``wrapper.run(q, (k_cache, v_cache), sinks, sm_scale)`` on a cache laid out
[num_pages, page_size, Hkv, D] ("NHD"), which is the engine's [slots, Hkv, D] cache viewed by
pages.  Decode is the same wrapper with one query per sequence.  The ragged (non-paged) prefill
uses FlashInfer's ragged wrapper compiled with the same variant (the JIT arguments the sink
wrapper builds, repeated here).  Without sinks the plain paged/ragged wrappers run.

:class:`SinkAttention` plans once per batch layout and runs per layer (the serving path).  The
registered op functions build and plan one per call (FlashInfer's plan copies indices to the
host), so ``backend="auto"`` never picks them; ask for ``backend="flashinfer"`` explicitly.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from .. import dispatch
from .attention_ref import check_heads, check_window

NAME = "flashinfer"
PRIORITY = 20
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace


def missing() -> str | None:
    """Why the backend cannot load, or None when the flashinfer package is installed."""
    if importlib.util.find_spec("flashinfer") is None:
        return "the flashinfer package is not installed (install its wheel: ../shared/tools/gpu-wheels.sh)"
    return None


def available(device: torch.device) -> dispatch.Availability:
    if device.type != "cuda":
        return dispatch.Availability(False, reason=f"FlashInfer runs on CUDA devices, got {device.type}")
    return dispatch.Availability(True, auto=False, reason="plans per call: explicit only")


def _sink_jit_args(backend: str, dtype: torch.dtype, d: int, dv: int, window_left: int) -> tuple[list[Any], dict[str, Any]]:
    """The JIT module of BatchAttentionWithAttentionSinkWrapper.__init__ (FlashInfer 0.5.3), for the ragged wrapper."""
    from flashinfer.jit.attention.variants import attention_sink_decl
    from flashinfer.jit.utils import filename_safe_dtype_map

    uri = f"batch_prefill_attention_sink_{filename_safe_dtype_map[dtype]}_swa_{window_left >= 0}_{backend}"
    args = [uri, dtype, dtype, dtype, torch.int32, d, dv, ["sink"], ["float"], ["sm_scale"], ["double"],
            "AttentionSink", attention_sink_decl[backend]]
    return args, {"use_sliding_window": window_left >= 0, "use_fp16_qk_reduction": False, "pos_encoding_mode": 0}


def pages(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Engine block tables [B, W] (-1 padded) + context lengths [B] -> FlashInfer's
    (kv_indptr int32 [B+1], kv_indices int32 [pages], last_page_len int32 [B])."""
    lens = context_lens.to(torch.int32)
    n_pages = (lens + block_size - 1) // block_size  # [B]
    indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = torch.cumsum(n_pages, 0)
    cols = torch.arange(block_tables.shape[1], device=lens.device)
    indices = block_tables[cols[None, :] < n_pages[:, None]].to(torch.int32)  # row-major: pages of seq 0, then 1, ...
    last = lens - (n_pages - 1) * block_size
    return indptr, indices, last


class SinkAttention:
    """One FlashInfer attention configuration (heads, dims, scale, window, sinks or not) with its workspace.

    FlashInfer 0.5.3 names the sink module by dtype, window and backend only, not by head dims:
    use one head-dim pair per process with sinks (the JIT build directory is shared).
    """

    def __init__(self, device: torch.device | str, dtype: torch.dtype, num_q_heads: int, num_kv_heads: int,
                 head_dim: int, head_dim_v: int | None = None, *, scale: float, window: int | None = None,
                 sinks: bool = True, backend: str = "auto") -> None:
        import flashinfer
        from flashinfer.utils import determine_attention_backend

        check_window(window)
        self.device = torch.device(device)
        self.dtype, self.hq, self.hkv = dtype, num_q_heads, num_kv_heads
        self.d, self.dv = head_dim, head_dim_v or head_dim
        self.scale = scale
        self.window_left = window - 1 if window is not None else -1
        self.sinks = sinks
        if backend == "auto":
            backend = determine_attention_backend(self.device, 0, False, False, dtype, dtype)
        self.backend = backend
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._fi = flashinfer
        self._wrapper: Any = None
        self._mode = ""  # "paged" or "ragged", set by the last plan
        self._block_size = 0

    def plan_paged(self, cu_seqlens_q: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> None:
        """Queries ragged by ``cu_seqlens_q`` (the last keys of each sequence) over the paged cache."""
        fi = self._fi
        if self.sinks:
            w = fi.BatchAttentionWithAttentionSinkWrapper(
                self.workspace, "NHD", backend=self.backend, q_data_type=self.dtype, kv_data_type=self.dtype,
                head_dim_qk=self.d, head_dim_vo=self.dv, window_left=self.window_left)
        else:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=self.backend)
        indptr, indices, last = pages(block_tables, context_lens, block_size)
        w.plan(cu_seqlens_q.to(torch.int32), indptr, indices, last, self.hq, self.hkv, self.d, block_size,
               head_dim_vo=self.dv, causal=True, sm_scale=self.scale, window_left=self.window_left,
               q_data_type=self.dtype, kv_data_type=self.dtype)
        self._wrapper, self._mode, self._block_size = w, "paged", block_size

    def plan_ragged(self, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> None:
        fi = self._fi
        if self.sinks:
            args, kwargs = _sink_jit_args(self.backend, self.dtype, self.d, self.dv, self.window_left)
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=self.backend, jit_args=args, jit_kwargs=kwargs)
        else:
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=self.backend)
        w.plan(cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32), self.hq, self.hkv, self.d, head_dim_vo=self.dv,
               causal=True, sm_scale=self.scale, window_left=self.window_left, q_data_type=self.dtype, kv_data_type=self.dtype)
        self._wrapper, self._mode = w, "ragged"

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
        """q [T, Hq, D]; k/v ragged [Tk, Hkv, D] or the paged cache [slots, Hkv, D] as planned -> [T, Hq, Dv]."""
        if self._wrapper is None:
            raise RuntimeError("SinkAttention.run before plan_paged/plan_ragged")
        if (sinks is not None) != self.sinks:
            raise ValueError(f"this SinkAttention was built with sinks={self.sinks}, called with sinks {'given' if sinks is not None else 'None'}")
        if self._mode == "paged":
            bs = self._block_size
            k = k.view(k.shape[0] // bs, bs, *k.shape[1:])  # [pages, page_size, Hkv, D]
            v = v.view(v.shape[0] // bs, bs, *v.shape[1:])
            kv: Any = (k, v)
            if self.sinks:
                return self._wrapper.run(q, kv, sinks.to(torch.float32).contiguous(), self.scale)
            return self._wrapper.run(q, kv)
        if self.sinks:
            return self._wrapper.run(q, k, v, sinks.to(torch.float32).contiguous(), self.scale)
        return self._wrapper.run(q, k, v)


def attention_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, sinks=None, window=None, block_tables=None,
                      block_size=0, max_seqlen_q=None) -> torch.Tensor:
    """:func:`.attention.attention_prefill` through FlashInfer (plans on every call)."""
    check_heads(q, k, v, sinks)
    attn = SinkAttention(q.device, q.dtype, q.shape[1], k.shape[1], q.shape[2], v.shape[2], scale=scale, window=window,
                         sinks=sinks is not None)
    if block_tables is None:
        attn.plan_ragged(cu_seqlens_q, cu_seqlens_k)
    else:
        attn.plan_paged(cu_seqlens_q, block_tables, cu_seqlens_k[1:] - cu_seqlens_k[:-1], block_size)
    return attn.run(q, k, v, sinks)


def attention_decode(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, sinks=None, window=None) -> torch.Tensor:
    """:func:`.attention.attention_decode` through FlashInfer (plans on every call)."""
    check_heads(q, k_cache, v_cache, sinks)
    attn = SinkAttention(q.device, q.dtype, q.shape[1], k_cache.shape[1], q.shape[2], v_cache.shape[2], scale=scale,
                         window=window, sinks=sinks is not None)
    cu_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    attn.plan_paged(cu_q, block_tables, context_lens, block_size)
    return attn.run(q, k_cache, v_cache, sinks)


def register() -> None:
    """Register the backend when its package is installed, else record why it is absent."""
    why = missing()
    if why is not None:
        dispatch.register_missing(NAME, why)
        return
    dispatch.register("attention_prefill", NAME, attention_prefill, available=available, priority=PRIORITY)
    dispatch.register("attention_decode", NAME, attention_decode, available=available, priority=PRIORITY)


register()
