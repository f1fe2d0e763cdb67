"""Weight-absorbed MLA decode (``mla_decode``): the torch reference against the expanded ("naive")
MLA written here from DeepSeek's formulas; the Triton kernel (CPU interpreter here, compiled with
``-m gpu``) and FlashInfer's MLA wrapper (``-m gpu``, when installed) against the reference; the
engine's MLA layer decoding through the op with a quantized kv_b_proj.

Tolerances: the naive check runs in float64 against the float32 reference: 1e-5 (float32
summation order over <= 64 terms).  float32 inputs in the interpreter (float32 dots): 1e-5.
bfloat16 in the interpreter (float32 dots; only the output rounding differs): 1 bf16 ulp
(rtol 2**-7).  bfloat16 on GPU (bf16 probabilities into the PV dot): atol = rtol = 1e-2, as the
sink-attention tests.  The reference runs on float32 copies of the inputs.
"""

from __future__ import annotations

import functools

import pytest
import torch

from quantkit.kernels import dispatch
from quantkit.kernels.mla import mla_ref as ref_ops
from quantkit.kernels.attention.attention_ref import paged_rows
from quantkit.kernels.dispatch import Dispatcher
from quantkit.kernels.mla import select
from quantkit.kernels.mla.flashinfer import MLADecode

from .test_attention import GPU_TOL, TOL, assert_close, tol

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def latent_cache(lens: list[int], rank: int, rope: int, bs: int, dtype: torch.dtype, device="cpu", seed=0):
    """Engine-layout caches kv [blocks*bs, rank], k_rot [blocks*bs, rope] with shuffled blocks; block table
    int32 [B, W] (-1 padded, one spare column); context lengths int32 [B]."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    blocks = sum(need) + 2
    perm = torch.randperm(blocks, generator=g)
    bt = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    i = 0
    for b, nb in enumerate(need):
        bt[b, :nb] = perm[i : i + nb]
        i += nb
    kv = torch.randn(blocks * bs, rank, generator=g)
    k_rot = torch.randn(blocks * bs, rope, generator=g)
    return kv.to(dtype).to(device), k_rot.to(dtype).to(device), bt.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def queries(b: int, h: int, rank: int, rope: int, dtype: torch.dtype, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    q_lat, q_rot = torch.randn(b, h, rank, generator=g), torch.randn(b, h, rope, generator=g)
    return q_lat.to(dtype).to(device), q_rot.to(dtype).to(device)


def f32(*ts):
    return [t.float() for t in ts]


# ---- the reference against the expanded MLA ---------------------------------------------------


def naive_mla(q_nope, q_rot, w_kv_b, kv, k_rot, rows, scale, nope):
    """DeepSeek MLA without absorption, one sequence, float64: keys and values expanded per head.

    q_nope [H, nope], q_rot [H, rope], kv_b weight [H * (nope + v), rank], kv [n, rank], k_rot [n, rope]."""
    h = q_nope.shape[0]
    c = kv[rows].double()
    kvh = (c @ w_kv_b.double().T).view(len(rows), h, -1)  # [n, H, nope + v]
    k = torch.cat((kvh[..., :nope], k_rot[rows].double()[:, None, :].expand(-1, h, -1)), dim=-1)  # [n, H, nope + rope]
    q = torch.cat((q_nope.double(), q_rot.double()), dim=-1)  # [H, nope + rope]
    p = torch.softmax(torch.einsum("hd,nhd->hn", q, k) * scale, dim=-1)
    return torch.einsum("hn,nhd->hd", p, kvh[..., nope:])  # [H, v]


@pytest.mark.parametrize("bs", [4, 16])
def test_reference_equals_expanded_mla(bs):
    """absorb (q_lat = q_nope W_UK, mla_decode, o_lat W_UV^T) == softmax(q k^T) v over expanded keys."""
    h, nope, v, rank, rope = 4, 16, 24, 32, 16
    lens = [1, 7, 13, 33]
    kv, k_rot, bt, ctx = latent_cache(lens, rank, rope, bs, torch.float32)
    g = torch.Generator().manual_seed(5)
    q_nope, q_rot = torch.randn(len(lens), h, nope, generator=g), torch.randn(len(lens), h, rope, generator=g)
    w = torch.randn(h * (nope + v), rank, generator=g) / rank**0.5
    w_uk, w_uv = w.view(h, nope + v, rank).split([nope, v], dim=1)  # DeepSeek's wkv_b split per head
    scale = (nope + rope) ** -0.5
    q_lat = torch.einsum("bhd,hdc->bhc", q_nope, w_uk)
    o_lat = ref_ops.mla_decode(q_lat, q_rot, kv, k_rot, bt, ctx, bs, scale)
    assert o_lat.shape == (len(lens), h, rank) and o_lat.dtype == torch.float32
    got = torch.einsum("bhc,hdc->bhd", o_lat, w_uv)
    for b, n in enumerate(lens):
        rows = paged_rows(bt, b, n, bs)
        want = naive_mla(q_nope[b], q_rot[b], w, kv, k_rot, rows, scale, nope)
        assert_close(got[b], want.float(), 1e-5, 1e-5, f"sequence {b} ({n} keys)")


def test_reference_one_key_returns_its_latent():
    """With one key the softmax is 1: o_lat is that latent for every head, whatever the scores."""
    kv, k_rot, bt, ctx = latent_cache([1], 32, 16, 4, torch.float32)
    q_lat, q_rot = queries(1, 4, 32, 16, torch.float32)
    out = ref_ops.mla_decode(q_lat * 100, q_rot, kv, k_rot, bt, ctx, 4, 1.0)
    row = int(bt[0, 0]) * 4
    assert torch.equal(out[0], kv[row].expand(4, -1))


def test_reference_rejects_bad_inputs():
    kv, k_rot, bt, ctx = latent_cache([5, 3], 32, 16, 4, torch.float32)
    q_lat, q_rot = queries(2, 4, 32, 16, torch.float32)
    call = ref_ops.mla_decode
    with pytest.raises(ValueError, match="wants q_lat"):
        call(q_lat[0], q_rot, kv, k_rot, bt, ctx, 4, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        call(q_lat, q_rot, kv[:, :16], k_rot, bt, ctx, 4, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        call(q_lat, q_rot[:, :2], kv, k_rot, bt, ctx, 4, 1.0)
    with pytest.raises(ValueError, match="2 queries"):
        call(q_lat, q_rot, kv, k_rot, bt[:1], ctx, 4, 1.0)
    with pytest.raises(ValueError, match=">= 1 key"):
        call(q_lat, q_rot, kv, k_rot, bt, torch.tensor([5, 0], dtype=torch.int32), 4, 1.0)
    with pytest.raises(ValueError, match="no block"):
        call(q_lat, q_rot, kv, k_rot, bt, torch.tensor([5, 9], dtype=torch.int32), 4, 1.0)


def test_backends_are_drop_ins_for_the_reference():
    """Triton (and the FlashInfer function, importable without flashinfer) take the reference's
    positional parameters and defaults; launch tuning only as keyword-only parameters."""
    import inspect

    from quantkit.kernels.mla import flashinfer as mla_flashinfer, decode as mla_triton

    assert "triton" in dispatch.backends("mla_decode") and dispatch.backends("mla_decode")[-1] == "torch"
    if not HAS_CUDA:
        assert dispatch.which("mla_decode", "cpu") == "torch"  # the interpreter only when asked for
    def positional(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]

    for fn in (mla_triton.mla_decode, mla_flashinfer.mla_decode):
        assert positional(fn) == positional(ref_ops.mla_decode), fn.__module__
    assert {"step", "state"} <= set(inspect.signature(mla_flashinfer.mla_decode).parameters) & set(inspect.signature(ref_ops.mla_decode).parameters)


# ---- Triton (interpreter on CPU, compiled on CUDA) -----------------------------------------


def triton(*args, **kw):
    return dispatch.call("mla_decode", *args, backend="triton", **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bs", [4, 16])
def test_triton_ragged_contexts(triton_device, dtype, bs):
    """Contexts of 1 key, within one block, not a multiple of the block, several chunks; H = 4 < BLOCK_H."""
    from quantkit.kernels.mla.decode import MLAConfig

    lens = [1, 7, 13, 37]
    kv, k_rot, bt, ctx = latent_cache(lens, 32, 16, bs, dtype, triton_device)
    q_lat, q_rot = queries(len(lens), 4, 32, 16, dtype, triton_device)
    want = ref_ops.mla_decode(*f32(q_lat, q_rot, kv, k_rot), bt, ctx, bs, 0.2)
    # compiled, bf16 operands feed bf16 tensor-core dots (the softmax weights rounded to bf16, as
    # FlashAttention and FlashInfer do; measured on the H200: up to 1.7e-3 off); the interpreter's dots run in float32
    for splits in (0, 1, 3):  # 0: from the shapes; 3 leaves some splits of short contexts empty
        got = triton(q_lat, q_rot, kv, k_rot, bt, ctx, bs, 0.2, config=MLAConfig(16, 16, 1, 1, splits))
        assert got.dtype == dtype
        assert_close(got, want, *tol(dtype, triton_device), f"mla decode bs={bs} splits={splits}")


def test_triton_head_blocks_odd_rank_and_int64_tables(triton_device):
    """H = 20 over two head blocks of 16 (the second partly masked), rank 48 and rope 8 (not powers
    of two), chunks of 32 tokens, int64 block tables, a strided q_rot (a view of a wider tensor)."""
    from quantkit.kernels.mla.decode import MLAConfig

    lens = [2, 45]
    kv, k_rot, bt, ctx = latent_cache(lens, 48, 8, 8, torch.float32, triton_device)
    q_lat, q_wide = queries(len(lens), 20, 48, 24, torch.float32, triton_device)
    q_rot = q_wide[..., 16:]
    want = ref_ops.mla_decode(q_lat, q_rot, kv, k_rot, bt, ctx, 8, 0.3)
    for cfg in (MLAConfig(16, 32, 1, 1, 2), MLAConfig(32, 16, 1, 1, 1)):
        got = triton(q_lat, q_rot, kv, k_rot, bt.long(), ctx, 8, 0.3, config=cfg)
        assert_close(got, want, *TOL[torch.float32], f"mla decode {cfg.name()}")


def test_triton_asserts_layouts(triton_device):
    from quantkit.kernels.mla.decode import MLAConfig

    kv, k_rot, bt, ctx = latent_cache([3], 32, 16, 4, torch.float32, triton_device)
    q_lat, q_rot = queries(1, 4, 32, 16, torch.float32, triton_device)
    with pytest.raises(AssertionError, match="one dtype"):
        triton(q_lat, q_rot, kv.to(torch.bfloat16), k_rot, bt, ctx, 4, 1.0)
    with pytest.raises(AssertionError, match="contiguous"):
        triton(q_lat.transpose(1, 2).contiguous().transpose(1, 2), q_rot, kv, k_rot, bt, ctx, 4, 1.0)
    with pytest.raises(AssertionError, match=">= 16"):
        triton(q_lat, q_rot, kv, k_rot, bt, ctx, 4, 1.0, config=MLAConfig(block_h=8))
    with pytest.raises(ValueError, match="do not fit"):
        triton(q_lat, q_rot, kv[:, :16], k_rot, bt, ctx, 4, 1.0)


# ---- the engine's MLA layer: absorbed decode with a quantized kv_b_proj -----------------------


def _linear(w: torch.Tensor, fp8: bool, bias: bool = False):
    from quantkit.engine.qlinear import Dense, Fp8Block, Linear
    from quantkit.formats import fp8_block

    return Linear(Fp8Block(*fp8_block.quantize_weight(w), None) if fp8 else Dense(w), torch.zeros(w.shape[0]) if bias else None)


def _mla_layer(fp8: bool, h=4, nope=16, rope=16, v=24, rank=32, hidden=48, kv_b_bias=False):
    from quantkit.engine.layers.mla import MLA
    from quantkit.engine.layers.norm import RMSNorm
    from quantkit.engine.layers.rope import Rope

    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g) / s[-1] ** 0.5
    return MLA(
        0, q_proj=_linear(r(h * (nope + rope), hidden), False), q_a_proj=None, q_a_norm=None, q_b_proj=None,
        kv_a_proj=_linear(r(rank + rope, hidden), False), kv_a_norm=RMSNorm(torch.ones(rank), 1e-6),
        kv_b_proj=_linear(r(h * (nope + v), rank), fp8, kv_b_bias), o_proj=_linear(r(hidden, h * v), False),
        rope=Rope(rope, {"rope_type": "default", "rope_theta": 10000.0}, "interleaved"), num_heads=h, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v,
        kv_lora_rank=rank, scale=(nope + rope) ** -0.5,
    )  # fmt: skip


@pytest.mark.parametrize("fp8", [False, True])
def test_engine_layer_decodes_through_the_op(fp8):
    """Decode steps (absorbed, ``mla_decode``) equal the naive prefill of the same tokens; the fp8-block
    kv_b_proj (weights only) is absorbed through its dequantized weight.  float32: 1e-5."""
    from quantkit.engine import Batch, KVCache

    layer = _mla_layer(fp8)
    x = torch.randn(9, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = layer(x, Batch.prefill([9]), None)
        cache = KVCache([layer.cache_spec()], num_blocks=4, block_size=4)
        parts = []
        for lo, hi in ((0, 5), (5, 6), (6, 7), (7, 8), (8, 9)):
            step = cache.schedule({"s": hi - lo})
            parts.append(layer(x[lo:hi], step, cache))
    assert layer.ops.last_backend("mla_decode") == "torch"
    assert_close(torch.cat(parts), whole, 1e-5, 1e-5, f"decode vs prefill (fp8 kv_b_proj: {fp8})")
    w_uk, w_uv = layer.absorbed_weights(torch.float32, torch.device("cpu"))
    assert torch.equal(torch.cat((w_uk, w_uv), dim=1).flatten(0, 1), layer.kv_b_proj.weight.dequant())


class _FakeStepMLA(MLADecode):
    """Stands in for FlashInfer's wrapper on the CPU (the real re-plan rule, ``plan_for``): counts plans and
    runs, attends with the reference."""

    made: list[_FakeStepMLA] = []

    def __init__(self, device, dtype, num_heads, rank, rope, *, scale, backend="auto"):
        self.scale, self.plans, self.runs, self._owner, self._planned = scale, 0, 0, None, None
        _FakeStepMLA.made.append(self)

    def plan(self, block_tables, context_lens, block_size):
        self.plans += 1
        self._planned, self._owner = (block_tables.clone(), context_lens.clone(), block_size), None

    def run(self, q_lat, q_rot, kv, k_rot):
        self.runs += 1
        return ref_ops.mla_decode(q_lat, q_rot, kv, k_rot, *self._planned, self.scale)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """FlashInfer's MLA backend as on a GPU where it serves the test layers' dims and dtype, its wrapper replaced by
    :class:`_FakeStepMLA` (the real re-plan rule and the real selection)."""
    from quantkit.kernels.mla import flashinfer as mla_flashinfer

    monkeypatch.setattr(mla_flashinfer, "MLADecode", _FakeStepMLA)
    monkeypatch.setattr(select, "FLASHINFER_DIMS", (32, 16))
    monkeypatch.setattr(select, "FLASHINFER_DTYPES", (torch.float32,))
    ok = lambda device: dispatch.Availability(True, auto=False)  # noqa: E731
    fi = functools.partial(select.choose, backend="flashinfer", triton=None)
    monkeypatch.setitem(dispatch.REGISTRY.ops["mla_decode"], "flashinfer",
                        dispatch.Backend("mla_decode", "flashinfer", mla_flashinfer.mla_decode, ok, 20, fi))
    _FakeStepMLA.made = []
    select.select_mla.cache_clear()
    yield
    select.select_mla.cache_clear()


def _two_layer_decode(per_op: dict, device="cpu", dtype=torch.float32, lens=(5, 5), **dims) -> tuple[list[torch.Tensor], Dispatcher]:
    """Two MLA layers sharing one dispatcher: a prefill of two sequences, then 3 decode steps."""
    from quantkit.engine import KVCache

    ops = Dispatcher(per_op=per_op)
    layers = [_mla_layer(False, **dims).to(device, dtype), _mla_layer(False, **dims).to(device, dtype)]
    layers[1].layer = 1
    for layer in layers:
        layer.ops = ops
    hidden = dims.get("hidden", 48)
    x = torch.randn(sum(lens) + 6, hidden, generator=torch.Generator().manual_seed(5)).to(device, dtype)
    cache = KVCache([layers[0].cache_spec()] * 2, num_blocks=-(-max(lens) // 4) * 2 + 8, block_size=4, dtype=dtype, device=device)
    outs = []
    with torch.no_grad():
        step = cache.schedule({"a": lens[0], "b": lens[1]})
        h = x[: sum(lens)]
        for layer in layers:
            h = layer(h, step, cache)
        for i in range(3):
            step = cache.schedule({"a": 1, "b": 1})
            h = x[sum(lens) + 2 * i: sum(lens) + 2 * i + 2]
            for layer in layers:
                h = layer(h, step, cache)
            outs.append(h)
    return outs, ops


def test_engine_decode_plans_flashinfer_once_per_step(fake_flashinfer):
    """Under backend auto, where FlashInfer serves: one wrapper for the model's layers, planned once per decode step
    (not per layer, not per call), and the steps equal the reference op's."""
    outs, ops = _two_layer_decode({})
    assert len(_FakeStepMLA.made) == 1, "one wrapper shared by the layers"
    dec = _FakeStepMLA.made[0]
    assert (dec.plans, dec.runs) == (3, 6), f"3 steps x 2 layers: plans {dec.plans}, runs {dec.runs}"
    assert ops.last_backend("mla_decode") == "flashinfer.planned"
    ref, ref_ops_ = _two_layer_decode({"mla_decode": "torch"})
    assert _FakeStepMLA.made == [dec] and ref_ops_.last_backend("mla_decode") == "torch", "an explicit backend plans nothing"
    for got, want in zip(outs, ref, strict=True):
        assert_close(got, want, 1e-6, 1e-6, "planned decode vs the reference op")


def test_engine_layer_runs_q_and_kv_a_as_one_projection(monkeypatch):
    """q_proj (or q_a_proj) and kv_a_proj_with_mqa take the same input: one fused GEMM over their shared
    storage (qlinear.fuse_rows), the same outputs as two."""
    from quantkit.engine import Batch, qlinear

    layer = _mla_layer(True)
    x = torch.randn(7, 48, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fused_out = layer(x, Batch.prefill([3, 4]), None)
    fused = layer.qkv_a.fused()
    assert fused is not None and fused.weight.shape == (4 * 32 + 32 + 16, 48)
    assert layer.q_proj.weight.w.untyped_storage().data_ptr() == fused.weight.w.untyped_storage().data_ptr()
    monkeypatch.setattr(qlinear, "fuse_rows", lambda parts: None)
    plain = _mla_layer(True)
    with torch.no_grad():
        plain_out = plain(x, Batch.prefill([3, 4]), None)
    assert plain.qkv_a.fused() is None
    assert torch.equal(fused_out, plain_out)


def test_engine_layer_rejects_a_kv_b_bias():
    with pytest.raises(ValueError, match="bias has no weight-absorbed decode"):
        _mla_layer(False, kv_b_bias=True)


# ---- GPU: compiled Triton at DeepSeek-V3 size, and FlashInfer --------------------------------

DEEPSEEK = {"h": 128, "rank": 512, "rope": 64, "scale": 192**-0.5}


@pytest.mark.gpu
@gpu
def test_gpu_triton_deepseek_size():
    """B=16 contexts of 4096 tokens, 128 heads, rank 512, rope 64, bf16, 16-token pages."""
    from quantkit.kernels.mla.decode import MLAConfig

    d = DEEPSEEK
    kv, k_rot, bt, ctx = latent_cache([4096] * 16, d["rank"], d["rope"], 16, torch.bfloat16, "cuda")
    q_lat, q_rot = queries(16, d["h"], d["rank"], d["rope"], torch.bfloat16, "cuda")
    assert dispatch.which("mla_decode", q_lat.device) == "triton"
    want = ref_ops.mla_decode(*f32(q_lat, q_rot, kv, k_rot), bt, ctx, 16, d["scale"])
    for cfg in (None, MLAConfig(num_splits=1), MLAConfig(block_h=32, block_n=64, num_warps=8, num_splits=5)):
        got = triton(q_lat, q_rot, kv, k_rot, bt, ctx, 16, d["scale"], config=cfg)
        assert_close(got, want, *GPU_TOL, f"gpu mla decode {cfg}")


@pytest.mark.gpu
@gpu
def test_gpu_triton_ragged_deepseek_dims():
    d = DEEPSEEK
    lens = [1, 15, 16, 17, 1000, 4100]
    kv, k_rot, bt, ctx = latent_cache(lens, d["rank"], d["rope"], 16, torch.bfloat16, "cuda")
    q_lat, q_rot = queries(len(lens), d["h"], d["rank"], d["rope"], torch.bfloat16, "cuda")
    want = ref_ops.mla_decode(*f32(q_lat, q_rot, kv, k_rot), bt, ctx, 16, d["scale"])
    assert_close(triton(q_lat, q_rot, kv, k_rot, bt, ctx, 16, d["scale"]), want, *GPU_TOL, "gpu mla ragged")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("page", [1, 16])
def test_gpu_flashinfer_matches_reference(page):
    pytest.importorskip("flashinfer")
    d = DEEPSEEK
    lens = [1, 17, 1000, 4100]
    kv, k_rot, bt, ctx = latent_cache(lens, d["rank"], d["rope"], page, torch.bfloat16, "cuda")
    q_lat, q_rot = queries(len(lens), d["h"], d["rank"], d["rope"], torch.bfloat16, "cuda")
    want = ref_ops.mla_decode(*f32(q_lat, q_rot, kv, k_rot), bt, ctx, page, d["scale"])
    got = dispatch.call("mla_decode", q_lat, q_rot, kv, k_rot, bt, ctx, page, d["scale"], backend="flashinfer")
    assert_close(got, want, *GPU_TOL, f"flashinfer mla page={page}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_gpu_engine_decode_on_planned_flashinfer(heads):
    """The engine's MLA layers at DeepSeek's latent dims (rank 512, rope 64), bf16: decode steps under backend
    auto run FlashInfer's wrapper planned once per step, and match the reference op's steps."""
    pytest.importorskip("flashinfer")
    dims = dict(h=heads, nope=128, rope=64, v=128, rank=512, hidden=256)
    outs, ops = _two_layer_decode({}, device="cuda", dtype=torch.bfloat16, lens=(37, 300), **dims)
    assert ops.last_backend("mla_decode") == "flashinfer.planned"
    assert len([k for k in ops.state if k[0] == "mla_flashinfer"]) == 1
    ref, ref_ops_ = _two_layer_decode({"mla_decode": "torch"}, device="cuda", dtype=torch.bfloat16, lens=(37, 300), **dims)
    assert ref_ops_.last_backend("mla_decode") == "torch" and not ref_ops_.state
    for i, (got, want) in enumerate(zip(outs, ref, strict=True)):
        assert_close(got, want, *GPU_TOL, f"engine decode step {i}, {heads} heads: flashinfer vs reference")


# ---- compiled for Hopper without a GPU ------------------------------------------------------

SM90_COMPILE = r'''
import os, subprocess, sys, tempfile
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from quantkit.kernels.mla import decode as M, tables as T

DIV16 = {"sql_b", "sql_h", "sqr_b", "sqr_h", "skv_t", "skr_t", "so_b", "so_h", "sop_b", "sop_h", "sop_s", "sl_b", "sl_h"}
def build(fn, consts, warps, stages):
    io = {n: "*bf16" for n in ("QL", "QR", "KV", "KR", "O")} | {"BT": "*i32", "CTX": "*i32", "OP": "*fp32", "LSE": "*fp32", "SINKS": "*fp32", "qk_scale": "fp32"}
    names = fn.arg_names  # what a launch specialises: 16-byte aligned pointers, strides divisible by 16
    sig = {n: "constexpr" if n in consts else io.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in DIV16}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
cfg = next(r.config for r in T.MLA if r.where == "compiled")  # the H200 row
for final in (False, True):
    k = build(M._mla_split_kernel, dict(RANK=512, ROPE=64, BLOCK_R=512, BLOCK_P=64, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
              FINAL=final, DOT=tl.bfloat16, PRECISION="tf32"), cfg.num_warps, cfg.num_stages)
    assert k.metadata.shared <= 227 * 1024, f"shared memory {k.metadata.shared} B exceeds Hopper's 227 KB"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    print(cfg.name(), usage.split("Resource usage:")[-1].strip()[:200])
from quantkit.kernels.attention import decode as D  # the merge kernel MLA shares with sink-attention decode
build(D._decode_merge_kernel, dict(BLOCK_S=64, HEAD_DV=512, BLOCK_DV=512, HAS_SINKS=False), 4, 1)
print("compiled")
'''


@pytest.mark.slow
def test_kernels_compile_for_sm90_without_a_gpu():
    """Triton compiles the split kernel (default config, DeepSeek dims, bf16) for Hopper within its
    shared memory, and the merge kernel.  Compiled mode: a subprocess
    without TRITON_INTERPRET."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, "-c", SM90_COMPILE], check=False, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
