"""FlashInfer's sink attention (0.5.x; lazy import, CUDA only): the benchmarks' baseline, not an op backend (its plan
copies indices to the host); MLA's FlashInfer backend shares :func:`pages` and :func:`available`.
``BatchAttentionWithAttentionSinkWrapper`` adds the sink to the denominator unscaled; ``window_left`` = W - 1.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from .. import dispatch
from .attention_ref import check_window

NAME = "flashinfer"
PRIORITY = 20
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace


def missing() -> str | None:
    """Why FlashInfer cannot load, or None."""
    if importlib.util.find_spec("flashinfer") is None:
        return "the flashinfer package is not installed (install its wheel: ../shared/tools/gpu-wheels.sh)"
    return None


def available(device: torch.device) -> dispatch.Availability:
    if device.type != "cuda":
        return dispatch.Availability(False, reason=f"FlashInfer runs on CUDA devices, got {device.type}")
    return dispatch.Availability(True, auto=False, reason="plans on the host: explicit only")


def _sink_jit_args(backend: str, dtype: torch.dtype, d: int, dv: int, window_left: int) -> tuple[list[Any], dict[str, Any]]:
    """The sink wrapper's JIT arguments (FlashInfer 0.5.3), for the ragged wrapper."""
    from flashinfer.jit.attention.variants import attention_sink_decl
    from flashinfer.jit.utils import filename_safe_dtype_map

    uri = f"batch_prefill_attention_sink_{filename_safe_dtype_map[dtype]}_swa_{window_left >= 0}_{backend}"
    args = [uri, dtype, dtype, dtype, torch.int32, d, dv, ["sink"], ["float"], ["sm_scale"], ["double"],
            "AttentionSink", attention_sink_decl[backend]]
    return args, {"use_sliding_window": window_left >= 0, "use_fp16_qk_reduction": False, "pos_encoding_mode": 0}


def pages(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block tables, context lengths -> FlashInfer's (kv_indptr, kv_indices, last_page_len), int32."""
    lens = context_lens.to(torch.int32)
    n_pages = (lens + block_size - 1) // block_size  # [B]
    indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = torch.cumsum(n_pages, 0)
    cols = torch.arange(block_tables.shape[1], device=lens.device)
    indices = block_tables[cols[None, :] < n_pages[:, None]].to(torch.int32)
    last = lens - (n_pages - 1) * block_size
    return indptr, indices, last


class SinkAttention:
    """One attention configuration and its workspace.  FlashInfer 0.5.3 names sink modules without head dims: one
    head-dim pair per process."""

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
        self._mode = ""  # "paged" or "ragged"
        self._block_size = 0

    def plan_paged(self, cu_seqlens_q: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> None:
        """Queries ragged by ``cu_seqlens_q`` over the paged cache."""
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
