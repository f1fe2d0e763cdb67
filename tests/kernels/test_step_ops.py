"""``rope_rotate``, ``rope_cache_write``, ``add_rmsnorm`` and ``router_topk`` (quantkit/kernels/attention/rope*.py,
norm/add_rmsnorm*.py, moe/router*.py): the Triton kernels give their references' bytes (the router: the same experts, weights within
float32 rounding; in the interpreter on the CPU, compiled on a GPU), the references are the engine's unfused ops
(the rotation and cache write exactly, RMSNorm to its specified sum order, the router's rules), and bad input
fails loudly.  Budget: under 30 s on 2 cores."""

from __future__ import annotations

import pytest
import torch

from quantkit.engine.layers.moe import Routing, route
from quantkit.engine.layers.norm import RMSNorm
from quantkit.engine.layers.rope import Rope
from quantkit.kernels import dispatch
from quantkit.kernels.attention import rope_ref
from quantkit.kernels.moe import router_ref
from quantkit.kernels.norm import add_rmsnorm_ref

DTYPES = [torch.bfloat16, torch.float32]
CUDA = torch.cuda.is_available()


def table(t: int, d: int, dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A YaRN table (GPT-OSS's parameters) at scattered positions, as the engine makes it."""
    rope = Rope(d, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})  # fmt: skip
    pos = torch.randint(0, 131072, (t,), generator=torch.Generator().manual_seed(t)).to(device)
    cos, sin = rope.cos_sin(pos, dtype)
    return cos[:, 0], sin[:, 0]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a, b.view(torch.uint8) if b.dtype == torch.bfloat16 else b)


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_reference_is_the_layer(style, dtype):
    rope = Rope(64, {"rope_type": "default", "rope_theta": 10000.0}, style)
    pos = torch.tensor([0, 5, 900, 4097])
    x = torch.randn(4, 3, 64).to(dtype)
    cos, sin = rope.cos_sin(pos, dtype)
    assert same(rope_ref.rope_rotate(x, cos[:, 0], sin[:, 0], style), rope(x, pos))


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 8, 64), (3, 16, 64), (2, 1, 64), (4, 3, 24)])
def test_rope_triton_bytes_equal_reference(shape, dtype, style):
    t, h, d = shape
    g = torch.Generator().manual_seed(1)
    big = (torch.randn(t, h + 2, d + 8, generator=g) * 3).to(dtype)
    x = big[:, 1 : h + 1, 4 : 4 + d]  # strided view, unit stride along D (MLA's q_rot is one)
    cos, sin = table(t, d, dtype)
    want = rope_ref.rope_rotate(x, cos, sin, style)
    got = dispatch.call("rope_rotate", x, cos, sin, style, backend="triton", block_h=2)
    assert same(got, want)


@pytest.mark.parametrize("order", ["hf", "f32"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 2880), (1, 256), (2, 1, 7168), (5, 320)])
def test_add_rmsnorm_triton_bytes_equal_reference(shape, dtype, order):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(shape, generator=g) * 4).to(dtype)
    y = torch.randn(shape, generator=g).to(dtype)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    want = add_rmsnorm_ref.add_rmsnorm(x, y, w, 1e-5, order)
    for tuning in ({"block_m": 2, "unroll": 2, "block_k": 128}, {}):  # a narrow launch and the default one
        got = dispatch.call("add_rmsnorm", x, y, w, 1e-5, order, backend="triton", **tuning)
        assert same(got[0], want[0]) and same(got[1], want[1]), tuning
    # against the engine's unfused add and RMSNorm: the sum exactly; the norm to the last bits of the mean
    s = x + y
    assert same(want[0], s)
    ref = RMSNorm(w, 1e-5, order)(s).float()
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-20
    assert ((want[1].float() - ref).abs() <= ulp * ref.abs().clamp_min(1e-3)).float().mean() == 1.0


def qkv_views(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, g: torch.Generator):
    """q, k, v as the fused q/k/v GEMM gives them: column views of one [T, (Hq + 2 Hkv) D] output."""
    y = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 3).to(dtype)
    q, k, v = y.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)


def rope_cache_case(t, hq, hkv, d, dtype, style, device="cpu", **kw):
    g = torch.Generator().manual_seed(t * 100 + hq)
    q, k, v = qkv_views(t, hq, hkv, d, dtype, g)
    cos, sin = table(t, d, dtype)
    slots = torch.randperm(3 * t + 4, generator=g)[:t]  # scattered rows of a 3T+4-slot cache
    caches = [torch.full((3 * t + 4, hkv, d), 7.0, dtype=dtype) for _ in range(4)]  # k, v: reference; k, v: op
    want = rope_ref.rope_cache_write(q, k, v, cos, sin, style, slots, caches[0], caches[1])
    dev = [a.to(device) for a in (q, k, v, cos, sin, slots, caches[2], caches[3])]
    if device != "cpu":  # views of one GEMM output on the device too
        y = torch.cat([a.reshape(t, -1) for a in (q, k, v)], dim=-1).to(device)
        dev[:3] = [a.view(t, -1, d) for a in y.split([hq * d, hkv * d, hkv * d], dim=-1)]
    got = dispatch.call("rope_cache_write", *dev[:5], style, *dev[5:], **kw)
    return (want, caches[0], caches[1]), (got.cpu(), dev[6].cpu(), dev[7].cpu()), (q, k, v, cos, sin, slots)


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 8, 2, 64), (1, 4, 4, 24), (5, 16, 4, 128)])
def test_rope_cache_write_triton_bytes_equal_reference(shape, dtype, style):
    want, got, (q, k, v, cos, sin, slots) = rope_cache_case(*shape, dtype, style, backend="triton", block_h=4)
    assert all(same(a, b) for a, b in zip(got, want))
    # the reference is the unfused path: rope_rotate on q and k, then the cache's index write
    assert same(want[0], rope_ref.rope_rotate(q, cos, sin, style))
    assert same(want[1][slots], rope_ref.rope_rotate(k, cos, sin, style)) and same(want[2][slots], v.contiguous())
    untouched = torch.ones(want[1].shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert bool((want[1][untouched] == 7).all() and (got[1][untouched] == 7).all() and (got[2][untouched] == 7).all())


ROUTER_CASES = [("topk_softmax", False, 32, 4, 2880, True), ("softmax_topk", True, 128, 8, 256, False),
                ("softmax_topk", False, 20, 3, 100, False), ("topk_softmax", False, 8, 8, 64, True)]  # fmt: skip


def router_case(rule, norm, e, k, h, bias, t, dtype=torch.bfloat16, device="cpu", **kw):
    g = torch.Generator().manual_seed(e + t)
    x = torch.randn(t, h, generator=g).to(dtype)
    w = (torch.randn(e, h, generator=g) * h**-0.5).to(dtype)  # as stored (bf16): the op upcasts it exactly
    b = torch.randn(e, generator=g) if bias else None
    want = route(torch.nn.functional.linear(x.float(), w.float(), b), Routing(rule, k, norm))
    assert all(torch.equal(a, c) for a, c in zip(router_ref.router_topk(x, w, b, k, rule, norm), want))  # the reference is the engine's router
    got = dispatch.call("router_topk", x.to(device), w.to(device), None if b is None else b.to(device), k, rule, norm, **kw)
    return want, (got[0].cpu(), got[1].cpu())


@pytest.mark.parametrize("case", ROUTER_CASES)
@pytest.mark.parametrize("t", [1, 19])
def test_router_topk_triton_matches_reference(case, t):
    (ww, wi), (gw, gi) = router_case(*case, t, backend="triton", block_t=2, k_split=64)
    assert gi.dtype == torch.int64 and torch.equal(gi, wi)
    assert gw.dtype == torch.float32 and torch.allclose(gw, ww, rtol=1e-5, atol=1e-6)


def test_bad_input_is_refused():
    x = torch.randn(2, 3, 64)
    cos, sin = table(2, 64, torch.float32)
    with pytest.raises(ValueError, match="rope style"):
        rope_ref.rope_rotate(x, cos, sin, "neox")
    with pytest.raises(ValueError, match="cos and sin"):
        rope_ref.rope_rotate(x, cos[:1], sin[:1])
    with pytest.raises(ValueError, match="one shape and dtype"):
        add_rmsnorm_ref.add_rmsnorm(torch.randn(2, 8), torch.randn(2, 8).bfloat16(), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="promote"):
        add_rmsnorm_ref.add_rmsnorm(torch.randn(2, 8).bfloat16(), torch.randn(2, 8).bfloat16(), torch.ones(8), 1e-6, "hf")
    q, kc = torch.randn(2, 4, 64), torch.zeros(9, 2, 64)
    with pytest.raises(ValueError, match="slots"):
        rope_ref.rope_cache_write(q, q[:, :2], q[:, :2], cos, sin, "half", torch.tensor([1.0, 2.0]), kc, kc.clone())
    with pytest.raises(ValueError, match="caches must be contiguous"):
        rope_ref.rope_cache_write(q, q[:, :2], q[:, :2], cos, sin, "half", torch.tensor([1, 2]), torch.zeros(9, 4, 64), kc)
    with pytest.raises(ValueError, match="top_k 9 of 8"):
        router_ref.router_topk(torch.randn(2, 16), torch.randn(8, 16), None, 9, "topk_softmax")
    with pytest.raises(ValueError, match="rule must be one of"):
        router_ref.router_topk(torch.randn(2, 16), torch.randn(8, 16), None, 2, "grouped_sigmoid")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_compiled_bytes_equal_reference(dtype):
    g = torch.Generator().manual_seed(3)
    for style, (t, h, d) in [("half", (256, 64, 64)), ("half", (1, 8, 64)), ("interleaved", (33, 128, 64)), ("half", (7, 32, 128))]:
        x = (torch.randn(t, h, d, generator=g) * 3).to(dtype)
        cos, sin = table(t, d, dtype)
        want = rope_ref.rope_rotate(x, cos, sin, style)
        got = dispatch.call("rope_rotate", x.cuda(), cos.cuda(), sin.cuda(), style)
        assert dispatch.which("rope_rotate", "cuda") == "triton" and same(got.cpu(), want), (style, t, h, d)
    for shape, order in [((1, 2880), "f32"), ((256, 2880), "f32"), ((37, 7168), "hf"), ((64, 4096), "hf")]:
        x, y = ((torch.randn(shape, generator=g) * 4).to(dtype) for _ in range(2))
        w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
        want = add_rmsnorm_ref.add_rmsnorm(x, y, w, 1e-6, order)
        got = dispatch.call("add_rmsnorm", x.cuda(), y.cuda(), w.cuda(), 1e-6, order)
        assert same(got[0].cpu(), want[0]) and same(got[1].cpu(), want[1]), (shape, order)
    for style, shape in [("half", (1, 64, 8, 64)), ("half", (200, 64, 8, 64)), ("interleaved", (7, 32, 4, 128))]:
        want, got, _ = rope_cache_case(*shape, dtype, style, device="cuda")
        assert dispatch.which("rope_cache_write", "cuda") == "triton" and all(same(a, b) for a, b in zip(got, want)), (style, shape)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("case", ROUTER_CASES)
@pytest.mark.parametrize("t", [1, 64, 1000])
def test_gpu_router_topk_matches_reference(case, t):
    (ww, wi), (gw, gi) = router_case(*case, t, device="cuda")
    assert dispatch.which("router_topk", "cuda") == "triton"
    # the same experts but where two float32 logits tie within the kernel's other summation order
    assert (gi == wi).all(dim=1).float().mean() >= 0.999 and torch.allclose(gw, ww, rtol=1e-4, atol=1e-6)
