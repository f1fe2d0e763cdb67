"""Sink attention: the torch reference against transformers' GPT-OSS eager attention and the
engine's attention; the Triton kernels (CPU interpreter here, compiled with ``-m gpu``) and
FlashInfer (``-m gpu``, when installed) against the reference.

Tolerances: float32 inputs run float32 dots (interpreter and IEEE on GPU): 1e-5.  bfloat16 in
the interpreter (float32 dots; only the output rounding differs): 1 bf16 ulp (rtol 2**-7).
bfloat16 on GPU (bf16 probabilities into the PV dot): atol = rtol = 1e-2, FlashInfer's own tolerance.
The reference runs on float32 copies of the inputs.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from quantkit.kernels.attention import attention_ref as ref_ops
from quantkit.kernels import dispatch

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-4, 2**-7)}  # interpreter (atol, rtol)
GPU_TOL = (1e-2, 1e-2)


def tol(dtype: torch.dtype, device: torch.device) -> tuple[float, float]:
    """The module docstring's tolerance for the Triton kernels on ``device``."""
    return GPU_TOL if device.type == "cuda" and dtype == torch.bfloat16 else TOL[dtype]


def assert_close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, what: str) -> None:
    """|out - ref| <= atol + rtol |ref| everywhere; on failure name the worst element."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o, r = out.float().cpu(), ref.float().cpu()
    excess = (o - r).abs() - (atol + rtol * r.abs())
    excess = torch.where(torch.isnan(o) | torch.isnan(r), torch.inf, excess)
    if bool((excess > 0).any()):
        i = tuple(int(x) for x in torch.unravel_index(excess.argmax(), excess.shape))
        raise AssertionError(f"{what}: {int((excess > 0).sum())} elements off; worst at {i}: got {o[i].item()}, want {r[i].item()}")


def cu(lengths: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def ragged(lq: list[int], lk: list[int], hq: int, hkv: int, d: int, dv: int, dtype: torch.dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), hq, d, generator=g)
    k = torch.randn(sum(lk), hkv, d, generator=g)
    v = torch.randn(sum(lk), hkv, dv, generator=g)
    sinks = torch.randn(hq, generator=g) * 2
    return [t.to(dtype).to(device) for t in (q, k, v)] + [sinks.to(device)]


def paged_cache(lens: list[int], hkv: int, d: int, dv: int, bs: int, dtype: torch.dtype, device="cpu", seed=0):
    """Engine-layout cache [blocks*bs, Hkv, D] with shuffled blocks; block table int32 [B, W] (-1 padded)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    perm = torch.randperm(sum(need) + 2, generator=g)
    bt = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    i = 0
    for b, nb in enumerate(need):
        bt[b, :nb] = perm[i : i + nb]
        i += nb
    slots = (sum(need) + 2) * bs
    kc = torch.randn(slots, hkv, d, generator=g).to(dtype)
    vc = torch.randn(slots, hkv, dv, generator=g).to(dtype)
    return kc.to(device), vc.to(device), bt.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def f32(*ts):
    return [t.float() if t is not None and t.is_floating_point() else t for t in ts]


# ---- the reference ---------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, 3])
def test_reference_matches_transformers_gpt_oss_eager(window):
    """transformers' GPT-OSS eager_attention_forward (sinks in the softmax, dropped after; additive mask)."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v, sinks = ragged([7], [7], 4, 2, 16, 16, torch.float32)
    pos = torch.arange(7)
    allowed = pos[None, :] <= pos[:, None]
    if window is not None:
        allowed &= pos[None, :] > pos[:, None] - window
    mask = torch.zeros(7, 7).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    module = SimpleNamespace(num_key_value_groups=2, sinks=sinks, training=False)
    want, _ = eager_attention_forward(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, 0.25)
    got = ref_ops.attend(q, k, v, pos, pos, 0.25, sinks, window)
    assert_close(got, want[0], 1e-6, 1e-5, "reference vs transformers")


def test_sink_joins_denominator_only():
    """out(sink) = out(no sink) * Z / (Z + e^sink), with Z = sum_j e^(s_j) computed here by logsumexp."""
    q, k, v, sinks = ragged([1], [6], 2, 2, 16, 16, torch.float32)
    pos_q, pos_k = torch.tensor([5]), torch.arange(6)
    plain = ref_ops.attend(q, k, v, pos_q, pos_k, 0.25)
    lse = torch.logsumexp(torch.einsum("nhd,mhd->hnm", q, k) * 0.25, dim=-1)  # [H, 1]
    keep = torch.sigmoid(lse - sinks[:, None]).T[..., None]  # Z / (Z + e^sink)
    assert_close(ref_ops.attend(q, k, v, pos_q, pos_k, 0.25, sinks), plain * keep, 1e-6, 1e-5, "sink")


def test_reference_ops_match_engine_attention_over_its_kv_cache():
    """The ops' references read the engine's paged layout: prefill then decode through KVCache/Batch."""
    from quantkit.engine.kv_cache import KVCache
    from quantkit.engine.layers.attention import attend_batch

    hq, hkv, d, w, scale = 4, 2, 16, 4, 0.25
    cache = KVCache([{"k": (hkv, d), "v": (hkv, d)}], num_blocks=12, block_size=4)
    expand, sinks = (lambda c: (c["k"], c["v"])), torch.randn(hq)
    for step, new in enumerate([{"a": 5, "b": 9}, {"a": 1, "b": 1}, {"a": 3, "b": 1}]):
        batch = cache.schedule(new)
        q, k, v, _ = ragged(list(new.values()), list(new.values()), hq, hkv, d, d, torch.float32, seed=step)
        want = attend_batch(0, batch, cache, q, {"k": k, "v": v}, expand, scale=scale, sinks=sinks, window=w)
        kc, vc = cache.layers[0]["k"], cache.layers[0]["v"]
        ctx = torch.tensor(batch.context_lens, dtype=torch.int32)
        got = ref_ops.attention_prefill(q, kc, vc, torch.tensor(batch.cu_seqlens, dtype=torch.int32), cu(batch.context_lens),
                                        scale, sinks, w, batch.block_tables, 4)
        assert torch.equal(got, want), f"step {step}: paged prefill reference differs from the engine"
        if all(n == 1 for n in new.values()):
            got = ref_ops.attention_decode(q, kc, vc, batch.block_tables, ctx, 4, scale, sinks, w)
            assert torch.equal(got, want), f"step {step}: decode reference differs from the engine"


def test_reference_rejects_bad_inputs():
    q, k, v, sinks = ragged([5], [5], 4, 2, 16, 16, torch.float32)
    c = cu([5])
    with pytest.raises(ValueError, match="do not fit"):
        ref_ops.attention_prefill(q, k[:, :, :8], v, c, c, 0.25)
    with pytest.raises(ValueError, match="do not fit"):
        ref_ops.attention_prefill(q[:, :3], k, v, c, c, 0.25)
    with pytest.raises(ValueError, match="sinks must be"):
        ref_ops.attention_prefill(q, k, v, c, c, 0.25, sinks[:2])
    with pytest.raises(ValueError, match="window"):
        ref_ops.attention_prefill(q, k, v, c, c, 0.25, window=0)
    with pytest.raises(ValueError, match="queries but only"):
        ref_ops.attention_prefill(q, k[:3], v[:3], c, cu([3]), 0.25)
    kc, vc, bt, lens = paged_cache([5, 3], 2, 16, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="each >= 1"):
        ref_ops.attention_decode(q[:2], kc, vc, bt, torch.tensor([5, 0], dtype=torch.int32), 4, 0.25)
    with pytest.raises(ValueError, match="no block"):
        ref_ops.attention_decode(q[:2], kc, vc, bt, torch.tensor([5, 9], dtype=torch.int32), 4, 0.25)


def test_dispatch_on_cpu_runs_the_reference_and_flashinfer_is_no_attention_backend():
    """FlashInfer's sink attention is the benchmarks' baseline only: asking the ops for it fails loudly."""
    assert dispatch.which("attention_prefill", "cpu") == "torch"
    assert dispatch.which("attention_decode", "cpu") == "torch"
    for op in ("attention_prefill", "attention_decode"):
        assert "flashinfer" not in dispatch.backends(op)
        with pytest.raises(dispatch.BackendUnavailable, match="flashinfer"):
            dispatch.which(op, "cpu", backend="flashinfer")


def test_flashinfer_page_lists_from_engine_block_tables():
    """FlashInfer's (indptr, indices, last_page_len) from the engine's -1 padded tables (pure torch, no flashinfer needed)."""
    from quantkit.kernels.attention.flashinfer import pages

    bt = torch.tensor([[7, 2, -1], [4, -1, -1], [0, 5, 6]])
    indptr, indices, last = pages(bt, torch.tensor([17, 16, 33], dtype=torch.int32), 16)
    assert indptr.tolist() == [0, 2, 3, 6]
    assert indices.tolist() == [7, 2, 4, 0, 5, 6]
    assert last.tolist() == [1, 16, 1]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


# ---- Triton (interpreter on CPU, compiled on CUDA) -----------------------------------------


def triton(op: str, *args, **kw):
    return dispatch.call(op, *args, backend="triton", **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [16, 64])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_triton_prefill_ragged(triton_device, dtype, d, window, with_sinks):
    q, k, v, sinks = ragged([5, 9], [5, 9], 4, 2, d, d, dtype, triton_device)
    s = sinks if with_sinks else None
    c = cu([5, 9], triton_device)
    want = ref_ops.attention_prefill(*f32(q, k, v), c, c, d**-0.5, s, window)
    got = triton("attention_prefill", q, k, v, c, c, d**-0.5, s, window)
    assert got.dtype == dtype
    assert_close(got, want, *tol(dtype, triton_device), f"prefill d={d} window={window} sinks={with_sinks}")


@pytest.mark.parametrize("window", [None, 3, 7])
def test_triton_prefill_after_a_prefix_and_from_the_paged_cache(triton_device, window):
    """Queries are the last keys (bottom-right causal); keys ragged, then gathered by block table."""
    q, k, v, sinks = ragged([3, 1, 9], [20, 6, 9], 4, 1, 16, 16, torch.float32, triton_device)
    cq, ck = cu([3, 1, 9], triton_device), cu([20, 6, 9], triton_device)
    want = ref_ops.attention_prefill(q, k, v, cq, ck, 0.25, sinks, window)
    assert_close(triton("attention_prefill", q, k, v, cq, ck, 0.25, sinks, window), want, *TOL[torch.float32], "prefix")
    kc, vc, bt, _ = paged_cache([20, 6, 9], 1, 16, 16, 4, torch.float32, triton_device)
    want = ref_ops.attention_prefill(q, kc, vc, cq, ck, 0.25, sinks, window, bt, 4)
    got = triton("attention_prefill", q, kc, vc, cq, ck, 0.25, sinks, window, bt, 4)
    assert_close(got, want, *TOL[torch.float32], "paged prefill")


@pytest.mark.parametrize("window", [None, 18, 47])
def test_triton_prefill_many_key_blocks(triton_device, window):
    """Sequences over several tiles so each of the three key loops (window edge, unmasked, diagonal)
    runs, with every loop bound on a block edge somewhere: the 14-key prefix puts a tile's first
    query two keys before one, 65 keys put the last query on one, window 18 starts row 32's window
    one key before one and window 47 starts row 63's one key after one (leaving unmasked blocks)."""
    from quantkit.kernels.attention.prefill import PrefillConfig

    q, k, v, sinks = ragged([30, 65], [44, 65], 4, 2, 16, 16, torch.float32, triton_device)
    cq, ck = cu([30, 65], triton_device), cu([44, 65], triton_device)
    want = ref_ops.attention_prefill(q, k, v, cq, ck, 0.25, sinks, window)
    for cfg in (PrefillConfig(16, 16, 1, 1), PrefillConfig(32, 16, 1, 1), PrefillConfig(16, 32, 1, 1)):
        got = triton("attention_prefill", q, k, v, cq, ck, 0.25, sinks, window, config=cfg)
        assert_close(got, want, *TOL[torch.float32], f"prefill {cfg.name()} window={window}")


def test_triton_prefill_odd_head_dims(triton_device):
    """Head dims that are not powers of two, D != Dv (MLA's 192/128 scaled down), no GQA."""
    q, k, v, sinks = ragged([5, 9], [5, 9], 2, 2, 24, 20, torch.float32, triton_device)
    c = cu([5, 9], triton_device)
    want = ref_ops.attention_prefill(q, k, v, c, c, 0.2, None, None)
    assert_close(triton("attention_prefill", q, k, v, c, c, 0.2), want, *TOL[torch.float32], "odd dims")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bs", [4, 16])
@pytest.mark.parametrize("window", [None, 4, 20])
def test_triton_decode_paged(triton_device, dtype, bs, window):
    from quantkit.kernels.attention.decode import DecodeConfig

    kc, vc, bt, lens = paged_cache([5, 9, 37], 2, 16, 16, bs, dtype, triton_device)
    q, _, _, sinks = ragged([3], [1], 4, 2, 16, 16, dtype, triton_device)
    want = ref_ops.attention_decode(*f32(q, kc, vc), bt, lens, bs, 0.25, sinks, window)
    for splits in (0, 1, 3):  # 0: from the shapes; 3 leaves some splits of short sequences empty
        cfg = DecodeConfig(16, 1, 1, num_splits=splits)
        got = triton("attention_decode", q, kc, vc, bt, lens, bs, 0.25, sinks, window, config=cfg)
        assert_close(got, want, *tol(dtype, triton_device), f"decode bs={bs} window={window} splits={splits}")


def test_triton_decode_pdl_is_a_request_with_the_same_bytes(triton_device):
    """``pdl`` launches the split and merge kernels as programmatic dependents where that exists; elsewhere (the
    interpreter, GPUs before sm_90) it is dropped: either way the same bytes as plain launches."""
    from quantkit.kernels.attention.decode import DecodeConfig

    kc, vc, bt, lens = paged_cache([5, 9, 37], 2, 16, 16, 4, torch.float32, triton_device)
    q, _, _, sinks = ragged([3], [1], 4, 2, 16, 16, torch.float32, triton_device)
    plain = triton("attention_decode", q, kc, vc, bt, lens, 4, 0.25, sinks, config=DecodeConfig(16, 1, 1, num_splits=3, pdl=False))
    dep = triton("attention_decode", q, kc, vc, bt, lens, 4, 0.25, sinks, config=DecodeConfig(16, 1, 1, num_splits=3, pdl=True))
    assert torch.equal(plain, dep)


def test_triton_decode_without_sinks_and_int64_tables(triton_device):
    kc, vc, bt, lens = paged_cache([1, 17], 2, 16, 16, 4, torch.float32, triton_device)
    q, _, _, _ = ragged([2], [1], 2, 2, 16, 16, torch.float32, triton_device)
    want = ref_ops.attention_decode(q, kc, vc, bt, lens, 4, 0.25)
    got = triton("attention_decode", q, kc, vc, bt.long(), lens, 4, 0.25)
    assert_close(got, want, *TOL[torch.float32], "decode int64 tables")


# ---- GPU: compiled Triton at GPT-OSS shapes, and FlashInfer ---------------------------------

GPT_OSS = dict(hq=64, hkv=8, d=64)


def _gpu_prefill_case(window, lens=(1, 17, 128, 300, 1030)):
    q, k, v, sinks = ragged(list(lens), list(lens), GPT_OSS["hq"], GPT_OSS["hkv"], 64, 64, torch.bfloat16, "cuda")
    c = cu(list(lens), "cuda")
    return q, k, v, sinks, c, ref_ops.attention_prefill(*f32(q, k, v), c, c, 0.125, sinks, window)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("window", [None, 128])
def test_gpu_triton_prefill_gpt_oss(window):
    q, k, v, sinks, c, want = _gpu_prefill_case(window)
    assert dispatch.which("attention_prefill", q.device) == "triton"
    assert_close(dispatch.call("attention_prefill", q, k, v, c, c, 0.125, sinks, window), want, *GPU_TOL, "gpu prefill")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("window", [None, 128])
def test_gpu_triton_decode_gpt_oss(window):
    from quantkit.kernels.attention.decode import DecodeConfig

    kc, vc, bt, lens = paged_cache([1, 15, 16, 17, 1000, 4100], 8, 64, 64, 16, torch.bfloat16, "cuda")
    q, _, _, sinks = ragged([6], [1], 64, 8, 64, 64, torch.bfloat16, "cuda")
    want = ref_ops.attention_decode(*f32(q, kc, vc), bt, lens, 16, 0.125, sinks, window)
    for cfg in (None, DecodeConfig(num_splits=1), DecodeConfig(block_n=128, num_splits=7)):
        got = dispatch.call("attention_decode", q, kc, vc, bt, lens, 16, 0.125, sinks, window, backend="triton", config=cfg)
        assert_close(got, want, *GPU_TOL, f"gpu decode {cfg}")
        plain = dispatch.call("attention_decode", q, kc, vc, bt, lens, 16, 0.125, sinks, window, backend="triton",
                              config=replace(cfg or DecodeConfig(), pdl=False))  # fmt: skip
        assert torch.equal(got, plain), f"{cfg}: programmatic dependent launch changed bytes"


@pytest.mark.gpu
@gpu
def test_gpu_triton_decode_pdl_in_a_cuda_graph():
    """The split and merge kernels as programmatic dependents, captured and replayed after new keys arrive: the same bytes
    as plain eager launches on the same cache."""
    from quantkit.kernels.attention.decode import DecodeConfig

    kc, vc, bt, lens = paged_cache([7, 300, 4100], 8, 64, 64, 16, torch.bfloat16, "cuda")
    q, _, _, sinks = ragged([3], [1], 64, 8, 64, 64, torch.bfloat16, "cuda")
    call = lambda pdl: dispatch.call("attention_decode", q, kc, vc, bt, lens, 16, 0.125, sinks, None, backend="triton",  # noqa: E731
                                     config=DecodeConfig(num_splits=8, pdl=pdl))  # fmt: skip
    call(True)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call(True)
    kc.copy_(torch.randn_like(kc))
    vc.copy_(torch.randn_like(vc))
    q.copy_(torch.randn_like(q))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, call(False))


@pytest.mark.gpu
@gpu
def test_gpu_triton_mla_dims_and_paged_prefill():
    q, k, v, _ = ragged([33, 200], [33, 200], 16, 16, 192, 128, torch.bfloat16, "cuda")
    c = cu([33, 200], "cuda")
    want = ref_ops.attention_prefill(*f32(q, k, v), c, c, 192**-0.5)
    assert_close(dispatch.call("attention_prefill", q, k, v, c, c, 192**-0.5, backend="triton"), want, *GPU_TOL, "mla dims")
    kc, vc, bt, _ = paged_cache([300, 70], 8, 64, 64, 16, torch.bfloat16, "cuda")
    q, _, _, sinks = ragged([100, 70], [1], 64, 8, 64, 64, torch.bfloat16, "cuda")
    cq, ck = cu([100, 70], "cuda"), cu([300, 70], "cuda")
    want = ref_ops.attention_prefill(*f32(q, kc, vc), cq, ck, 0.125, sinks, 128, bt, 16)
    got = dispatch.call("attention_prefill", q, kc, vc, cq, ck, 0.125, sinks, 128, bt, 16, backend="triton")
    assert_close(got, want, *GPU_TOL, "gpu paged prefill")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("window", [None, 128])
def test_gpu_flashinfer_baseline_matches_reference(window):
    """The benchmarks' FlashInfer baseline (SinkAttention, ragged and paged) computes the ops' function."""
    pytest.importorskip("flashinfer")
    from quantkit.kernels.attention.flashinfer import SinkAttention

    q, k, v, sinks, c, want = _gpu_prefill_case(window)
    attn = SinkAttention(q.device, q.dtype, 64, 8, 64, scale=0.125, window=window)
    attn.plan_ragged(c, c)
    assert_close(attn.run(q, k, v, sinks), want, *GPU_TOL, "fi prefill")
    kc, vc, bt, lens = paged_cache([1, 17, 1000, 4100], 8, 64, 64, 16, torch.bfloat16, "cuda")
    q, _, _, sinks = ragged([4], [1], 64, 8, 64, 64, torch.bfloat16, "cuda")
    want = ref_ops.attention_decode(*f32(q, kc, vc), bt, lens, 16, 0.125, sinks, window)
    attn.plan_paged(torch.arange(5, dtype=torch.int32, device="cuda"), bt, lens, 16)
    got = attn.run(q, kc, vc, sinks)
    assert_close(got, want, *GPU_TOL, "fi decode")
    assert math.isfinite(float(got.float().abs().max()))


# ---- compiled for Hopper without a GPU ------------------------------------------------------

SM90_COMPILE = r'''
import sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from quantkit.kernels.attention import prefill as P, decode as Dd

DIV16 = {"sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "so_t", "so_h", "sq_b", "so_b", "sop_b", "sop_h", "sop_s", "sl_b", "sl_h"}
def build(fn, ptrs, consts, warps, stages):
    names = fn.arg_names  # what a launch specialises: 16-byte aligned pointers, strides divisible by 16
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in DIV16}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
io = {n: "*bf16" for n in ("Q", "K", "V", "O")} | {"SINKS": "*fp32", "CU_Q": "*i32", "CU_K": "*i32", "BT": "*i32", "CTX": "*i32",
                                                  "OP": "*fp32", "LSE": "*fp32", "qk_scale": "fp32"}
common = dict(HEAD_DV=64, BLOCK_DV=64, HAS_SINKS=True)
for paged in (False, True):
    k = build(P._prefill_kernel, io, dict(common, GROUP=8, HEAD_D=64, BLOCK_D=64, BLOCK_M=128, BLOCK_N=64, HAS_WINDOW=True,
              PAGED=paged, DOT=tl.bfloat16, PRECISION="tf32"), 4, 3)
    ir = k.asm["ttgir"]
    assert "warp_group_dot" in ir and "async_copy_global_to_local" in ir, "prefill: no wgmma or no pipelined loads"
for final in (False, True):
    build(Dd._decode_split_kernel, io, dict(common, GROUP=8, BLOCK_H=16, HEAD_D=64, BLOCK_D=64, BLOCK_N=64, HAS_WINDOW=True,
          FINAL=final, DOT=tl.bfloat16, PRECISION="tf32"), 4, 3)
build(Dd._decode_merge_kernel, io, dict(common, BLOCK_S=64), 4, 1)
print("compiled")
'''


@pytest.mark.slow
def test_kernels_compile_for_sm90_without_a_gpu():
    """Triton compiles the kernels for Hopper (ptxas ships in the triton wheel): wgmma dots and
    pipelined (cp.async) K/V loads in prefill; decode and merge build.  Compiled mode, so a
    subprocess without TRITON_INTERPRET."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, "-c", SM90_COMPILE], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
