"""DeepGEMM's FP8-block GEMM for Hopper (sm_90a), compiled per (N, K, tiles) with ``nvcc`` from the copy of
``fp8_gemm_kernel`` that ``flashinfer-python`` (0.5.x) ships (PyPI's ``deep-gemm`` has no CUDA headers), cached in
``~/.cache/quantkit/deepgemm`` and launched through a small C entry point loaded with ctypes (:func:`configure`).

Operands: A E4M3 [M, K] row-major; its scales F32 MN-major [ceil(K/128), M rounded up to 4] (the quantizers write that
layout with ``scale_mn=True``, then no copy is made); W E4M3 [N, K] with F32 scales [ceil(N/128), ceil(K/128)]; out bf16
[M, N].  The kernel is compiled for K rounded up to 128 while the TMA descriptors carry the true K, so TMA zero-fills
the tail.  K % 16 == 0 (16-byte TMA rows), N % 8 == 0 (the TMA store).  Grouped contiguous (MoE): A's rows sorted by
expert and padded to 128 per expert, ``m_indices`` int32 [M]; W [E * N, K], scales [E, ceil(N/128), K/128].
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import dispatch
from ..dispatch import SM90_SMEM, capability, sm_count, wave_key
from ...formats import fp8_block

BLOCK = 128
NVCC_DEFAULT = Path("/usr/local/cuda/bin/nvcc")  # where nvcc is not on PATH


@dataclass
class Settings:
    """None: FlashInfer's headers, nvcc on PATH or :data:`NVCC_DEFAULT`, ``~/.cache/quantkit/deepgemm``."""

    include_dir: Path | None = None
    nvcc: Path | None = None
    cache_dir: Path | None = None


SETTINGS = Settings()


def configure(include_dir: str | Path | None = None, nvcc: str | Path | None = None, cache_dir: str | Path | None = None) -> None:
    SETTINGS.include_dir = Path(include_dir) if include_dir else None
    SETTINGS.nvcc = Path(nvcc) if nvcc else None
    SETTINGS.cache_dir = Path(cache_dir) if cache_dir else None
    _AVAIL.clear()


PRIORITY = 4  # explicit; auto reaches it through the gemm_fp8_block selection

SOURCE = r"""
#include <cstdio>
#include <string>
#include <type_traits>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <deep_gemm/nvrtc_cutlass.cuh>
#include <deep_gemm/fp8_gemm_impl.cuh>
#include <deep_gemm/tma_utils.cuh>
using namespace deep_gemm;

using Sched = SchedulerSelector<GemmType::QK_GT, QK_N, QK_K, QK_BM, QK_BN, 128, QK_GROUPS, QK_MC>::type;
static auto kern = &fp8_gemm_kernel<QK_N, QK_K, QK_BM, QK_BN, 128, QK_GROUPS, QK_STAGES, 128, 128, QK_MC, Sched, QK_INPUT>;

static bool desc(CUtensorMap* m, void* p, CUtensorMapDataType dt, uint64_t inner, uint64_t outer, uint64_t stride,
                 uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle sw) {
  static PFN_cuTensorMapEncodeTiled_v12000 enc = get_cuTensorMapEncodeTiled();
  uint64_t dims[2] = {inner, outer};
  uint64_t strides[1] = {stride};
  uint32_t box[2] = {box_inner, box_outer};
  uint32_t es[2] = {1, 1};
  return enc(m, dt, 2, p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// 0 on success; 1-4 a TMA descriptor was refused; 5 the shared-memory attribute; 6 the launch.
// QK_K: K rounded up to 128 (the kernel's K loop); QK_KT: the true K (the operands' rows; TMA zero-fills past it).
extern "C" int qk_launch(void* a, void* sa, void* b, void* sb, void* d, void* layout, uint32_t m, int num_sms,
                         int smem, void* stream) {
  const uint32_t N = QK_N, K = QK_KT, KB = (QK_K + 127) / 128, m4 = (m + 3) / 4 * 4;
  CUtensorMap ta, tb, ts, td;
  if (!desc(&ta, a, CU_TENSOR_MAP_DATA_TYPE_UINT8, K, m, K, 128, QK_BM, CU_TENSOR_MAP_SWIZZLE_128B)) return 1;
  if (!desc(&tb, b, CU_TENSOR_MAP_DATA_TYPE_UINT8, K, (uint64_t)N * QK_GROUPS, K, 128, QK_BN, CU_TENSOR_MAP_SWIZZLE_128B)) return 2;
  if (!desc(&ts, sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, m4, KB, (uint64_t)m4 * 4, QK_BM, 1, CU_TENSOR_MAP_SWIZZLE_NONE)) return 3;
  if (!desc(&td, d, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, N, m, (uint64_t)N * 2, QK_BN < N ? QK_BN : N, QK_BM < m ? QK_BM : m,
            CU_TENSOR_MAP_SWIZZLE_NONE)) return 4;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 5;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = num_sms;
  cfg.blockDim = get_num_threads_per_sm<128, 128>(QK_BM);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = (cudaStream_t)stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim = {QK_MC, 1, 1};
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  QK_INPUT in{};
  in.shape_m = m;
  in.grouped_layout = (int*)layout;
  return cudaLaunchKernelEx(&cfg, kern, (__nv_bfloat16*)d, (float*)sb, in, ta, tb, ts, td) == cudaSuccess ? 0 : 6;
}
"""


class BuildError(RuntimeError):
    """nvcc could not build a kernel."""


@dataclass(frozen=True)
class Config:
    """One compiled kernel: tiles, stages, TMA multicast (cluster size), shared memory bytes."""

    block_m: int
    block_n: int
    stages: int
    multicast: int
    smem: int

    def __str__(self) -> str:
        return self.name()

    def name(self) -> str:
        return f"dg {self.block_m}x{self.block_n} st{self.stages} mc{self.multicast}"


def include_dir() -> Path | None:
    if SETTINGS.include_dir is not None:
        roots = [SETTINGS.include_dir]
    else:
        spec = importlib.util.find_spec("flashinfer")  # finds the package without importing it
        roots = [Path(p) / "data" / "csrc" / "nv_internal" / "tensorrt_llm" for p in (spec.submodule_search_locations or [])] if spec else []
    return next((r for r in roots if (r / "deep_gemm" / "fp8_gemm_impl.cuh").is_file()), None)


def nvcc_path() -> str | None:
    if SETTINGS.nvcc is not None:
        return str(SETTINGS.nvcc) if SETTINGS.nvcc.is_file() else None
    return shutil.which("nvcc") or (str(NVCC_DEFAULT) if NVCC_DEFAULT.is_file() else None)


def available(device: torch.device) -> dispatch.Availability:
    if device.type != "cuda":
        return dispatch.Availability(False, reason=f"DeepGEMM needs a CUDA device, got {device.type}")
    major, minor = capability(device)
    if (major, minor) != (9, 0):
        return dispatch.Availability(False, reason=f"DeepGEMM's fp8_gemm_kernel is sm_90a-only, got sm_{major}{minor}")
    if include_dir() is None:
        return dispatch.Availability(False, reason="no deep_gemm headers: install flashinfer-python (0.5.x ships them) or deepgemm.configure(include_dir=...)")
    if nvcc_path() is None:
        return dispatch.Availability(False, reason="no nvcc on PATH (or deepgemm.configure(nvcc=...)): DeepGEMM kernels are compiled per shape")
    return dispatch.Availability(True, auto=False, reason="explicit; auto runs it through gemm_fp8_block's selection")


_AVAIL: dict[str, dispatch.Availability] = {}


def available_cached(device: torch.device) -> dispatch.Availability:
    """:func:`available`, asked once per device (it looks on disk)."""
    key = str(device)
    if key not in _AVAIL:
        _AVAIL[key] = available(device)
    return _AVAIL[key]


def disable(device: torch.device, why: str) -> None:
    """DeepGEMM unavailable on ``device`` from now on (after a failed build)."""
    _AVAIL[str(device)] = dispatch.Availability(False, reason=why)


def smem_size(stages: int, k: int, block_m: int, block_n: int) -> int:
    """DeepGEMM's formula: D tile, A / B / A-scale stages, every K block's B scales, barriers."""
    kb = -(-k // BLOCK)
    sb = -(-(kb * 4 * (1 if BLOCK % block_n == 0 else 2)) // 8) * 8
    return block_m * block_n * 2 + stages * (block_m * BLOCK + block_n * BLOCK + block_m * 4) + sb + stages * 16


@functools.lru_cache(maxsize=1024)  # asked on every launch; a pure function of its ints
def best_config(m: int, n: int, k: int, num_sms: int, groups: int = 1, contiguous: bool = False) -> Config:
    """DeepGEMM's rule: the BLOCK_N with the fewest waves, then the fullest last wave, then the smaller; the
    most stages that fit; a 2-block cluster from M = 1024."""
    block_m = 128 if contiguous or m > 64 else 64
    best = min(range(16, 129, 8), key=lambda bn: (*wave_key(-(-m // block_m) * -(-n // bn) * groups, num_sms), bn))
    stages = next((s for s in ((8, 7, 6, 5, 4) if BLOCK % best == 0 else (6, 5, 4)) if smem_size(s, k, block_m, best) <= SM90_SMEM), 0)
    if not stages:
        raise ValueError(f"DeepGEMM: K={k} leaves no room for 4 stages of {block_m}x{best} tiles")
    mc = 2 if m >= 1024 and groups == 1 and n % (best * 2) == 0 and num_sms % 2 == 0 else 1
    return Config(block_m, best, stages, mc, smem_size(stages, k, block_m, best))


def config_m(m: int) -> int:
    """M bucketed (64, 128, then powers of two): a few kernels per (N, K), not one per batch size."""
    return 64 if m <= 64 else 128 if m <= 128 else 1 << (m - 1).bit_length()


def launch_config(m: int, n: int, k: int, device: torch.device, contiguous: bool = False) -> Config:
    """The config a launch of M rows on an [N, K] weight runs."""
    return config_for(m, n, k, sm_count(device), contiguous)


def config_for(m: int, n: int, k: int, sms: int, contiguous: bool = False) -> Config:
    return best_config(config_m(m), n, -(-k // BLOCK) * BLOCK, sms, 1, contiguous)


_LIBS: dict[tuple, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def _cache_dir() -> Path:
    return SETTINGS.cache_dir or Path.home() / ".cache" / "quantkit" / "deepgemm"


def build(n: int, k: int, cfg: Config, groups: int = 1, contiguous: bool = False) -> ctypes.CDLL:
    """Compile (once, then from the disk cache) and load the kernel for (N, true K, config)."""
    key = (n, k, cfg.block_m, cfg.block_n, cfg.stages, cfg.multicast, groups, contiguous)
    with _LOCK:
        lib = _LIBS.get(key)
    if lib is not None:
        return lib
    inc, nvcc = include_dir(), nvcc_path()
    if inc is None or nvcc is None:
        raise BuildError(f"DeepGEMM cannot be built: headers {inc}, nvcc {nvcc}")
    gt, inp = ("GroupedContiguous", "GroupedContiguousSchedulerInput") if contiguous else ("Normal", "NormalSchedulerInput")
    defs = {"QK_N": n, "QK_K": -(-k // BLOCK) * BLOCK, "QK_KT": k, "QK_BM": cfg.block_m, "QK_BN": cfg.block_n, "QK_STAGES": cfg.stages, "QK_MC": cfg.multicast,
            "QK_GROUPS": groups, "QK_GT": gt, "QK_INPUT": inp}  # fmt: skip
    flags = ["-std=c++17", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-diag-suppress", "177", "-cudart", "shared",
             "-Xcompiler", "-fPIC", "-shared", f"-I{inc}", *(f"-D{a}={b}" for a, b in defs.items())]  # fmt: skip
    digest = hashlib.sha256("\n".join([SOURCE, str(inc), nvcc, *flags]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"dg_{gt}_{n}_{k}_{cfg.block_m}x{cfg.block_n}_s{cfg.stages}_mc{cfg.multicast}_g{groups}_{digest}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src, so = Path(tmp) / "k.cu", Path(tmp) / "k.so"
            src.write_text(SOURCE)
            run = subprocess.run([nvcc, *flags, "-o", str(so), str(src)], capture_output=True, text=True)
            if run.returncode:
                raise BuildError(f"DeepGEMM build failed for N={n} K={k} {cfg.name()}:\n{run.stderr[-3000:]}")
            os.replace(so, out)  # atomic: concurrent builders of one key leave one whole file
    lib = ctypes.CDLL(str(out))
    lib.qk_launch.restype = ctypes.c_int
    lib.qk_launch.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_uint32, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    with _LOCK:
        _LIBS[key] = lib
    return lib


def prebuild(jobs: Iterable[tuple[int, int, Config]], workers: int = 8) -> list[str]:
    """Compile kernels ahead, ``workers`` at a time (about 4-5 s each); the failed builds' messages."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, workers)) as pool:
        futures = [pool.submit(build, n, k, cfg) for n, k, cfg in sorted(set(jobs), key=str)]
    return [str(f.exception()) for f in futures if f.exception() is not None]


@dataclass(frozen=True)
class DeepGemmWeight:
    """``w`` E4M3 [groups * N, K] contiguous, ``scale`` F32 contiguous."""

    w: torch.Tensor
    scale: torch.Tensor
    n: int  # output columns (per group)
    k: int  # the true K
    groups: int = 1


def prepare_weight(w: torch.Tensor, w_scale: torch.Tensor) -> DeepGemmWeight:
    grouped = w.dim() == 3
    groups, n, k = (w.shape if grouped else (1, *w.shape))
    kb = -(-k // BLOCK)
    if tuple(w_scale.shape[-2:]) != (-(-n // BLOCK), kb):
        raise ValueError(f"DeepGEMM: weight scales {tuple(w_scale.shape)} do not fit a weight {tuple(w.shape)} (need [ceil(N/128), ceil(K/128)])")
    if n % 8:
        raise ValueError(f"DeepGEMM: N={n} is not a multiple of 8 (the output rows are stored by TMA in 16-byte units)")
    if k % 16:
        raise ValueError(f"DeepGEMM: K={k} is not a multiple of 16 (TMA needs 16-byte row strides)")
    wp = w.reshape(groups * n, k).contiguous()
    return DeepGemmWeight(wp, w_scale.to(torch.float32).contiguous(), n, k, groups)


def mn_major_scales(a_scale: torch.Tensor, rows: int) -> torch.Tensor:
    """F32 [M, kb] activation scales -> contiguous [kb, rows] (extra columns zero); no copy where a quantizer
    wrote them MN-major with ``rows`` columns."""
    base = fp8_block.mn_major_storage(a_scale)
    if base is not None and base.shape[1] == rows:
        return base
    return fp8_block.mn_major_copy(a_scale, rows)


def prepare_act(a: torch.Tensor, a_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row-major [M, K], MN-major scales [kb, M rounded up to 4])."""
    return a.contiguous(), mn_major_scales(a_scale, fp8_block.mn_rows(a.shape[0]))


def gemm_prepared(a: torch.Tensor, sa: torch.Tensor, dw: DeepGemmWeight, m_indices: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, cfg: Config | None = None) -> torch.Tensor:  # fmt: skip
    """One launch -> bf16 [M, N]; ``m_indices`` makes it grouped contiguous."""
    m, k = a.shape
    if k != dw.k:
        raise ValueError(f"DeepGEMM: activation K={k} does not match the weight's K={dw.k}")
    if m == 0:  # a TMA descriptor cannot describe zero rows
        return torch.empty((0, dw.n), dtype=torch.bfloat16, device=a.device) if out is None else out
    contiguous = m_indices is not None
    if contiguous and m % BLOCK:
        raise ValueError(f"DeepGEMM grouped contiguous: M={m} rows must be padded to a multiple of {BLOCK} per expert")
    sms = sm_count(a.device)
    cfg = cfg or launch_config(m, dw.n, k, a.device, contiguous)
    lib = build(dw.n, k, cfg, dw.groups, contiguous)
    out = torch.empty((m, dw.n), dtype=torch.bfloat16, device=a.device) if out is None else out
    layout = m_indices.data_ptr() if contiguous else 0
    with torch.cuda.device(a.device):  # the runtime launches on its current device
        stream = torch.cuda.current_stream(a.device).cuda_stream
        rc = lib.qk_launch(a.data_ptr(), sa.data_ptr(), dw.w.data_ptr(), dw.scale.data_ptr(), out.data_ptr(), layout, m, sms, cfg.smem, stream)
    if rc:
        raise RuntimeError(f"DeepGEMM launch failed (code {rc}) for M={m} N={dw.n} K={k} {cfg.name()}")
    return out


def gemm_fp8_block_deepgemm(a, a_scale, w, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """The op's DeepGEMM leaf: bf16 out, then bias / out_dtype with one more rounding."""
    dw = prepare_weight(w, w_scale)
    a2, s2 = a.reshape(-1, a.shape[-1]), a_scale.reshape(-1, a_scale.shape[-1])
    ap, sa = prepare_act(a2, s2)
    y = gemm_prepared(ap, sa, dw)
    if bias is not None or out_dtype != torch.bfloat16:
        y = (y.to(torch.float32) + (0 if bias is None else bias.to(torch.float32))).to(out_dtype)
    return y.reshape(*a.shape[:-1], dw.n)

