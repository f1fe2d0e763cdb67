"""Fused norm / activation + activation quantization: rmsnorm_act_quant, silu_mul_act_quant,
swiglu_act_quant.

* Triton (compiled on CUDA, else the CPU interpreter) equals the ops' torch references bit for bit
  (NaN matches NaN) on tiny awkward shapes: M = 1, partial 128-groups, 3-D inputs, strided
  [gate | up] halves, interleaved gate_up, bf16 and f32, NaN / inf / zero / subnormal / huge rows.
* The references are the engine's unfused path: bit for bit for the activations in bfloat16 (the
  specified SiLU / sigmoid equal torch's on every bfloat16 input), within stated bounds where
  the specification fixes what torch leaves open (RMSNorm's summation order; exp in float32).
* The engine: a DeepSeek checkpoint in bfloat16 gives the same logits with the fused MLP as
  with torch's silu (fp8-block, float and ue8m0 scales); float32 keeps the unfused MLP.
* Every rejected input gets its message, from both backends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from quantkit.engine.layers import mlp as mlp_layer
from quantkit.engine.layers.norm import RMSNorm
from quantkit.engine.qlinear import ActQuant, Dense, Fp8Block, Linear, Mxfp8
from quantkit.formats import fp8_block, mxfp8
from quantkit.kernels import dispatch
from quantkit.kernels.quant import fused_act_quant
from quantkit.kernels.quant import fused_act_quant_ref as R
from quantkit.kernels.moe.fused_moe_ref import MoeSpec, activation

from .kernel_cases import assert_same

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

# (fmt, scale_fmt, rule) and the row lengths each is tested at (fp8-block: partial last 128-group)
FMTS = [("fp8-block", "float", "rceil"), ("fp8-block", "ue8m0", "rceil"), ("fp8-block", "ue8m0", "floor"), ("mxfp8", "float", "rceil"), ("mxfp8", "float", "floor")]
NORM_K = {"fp8-block": (200, 300), "mxfp8": (160, 288)}
ACT_I = {"fp8-block": 160, "mxfp8": 96}
BACKENDS = ("torch", "triton")


def call(op: str, backend: str, *args, **kw):
    return dispatch.call(op, *args, backend=backend, **kw)


def check_pair(ref: tuple[torch.Tensor, torch.Tensor], out: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    assert_same(ref[1], out[1], f"{what} scales")
    assert_same(ref[0], out[0], f"{what} elements")


def magnitudes(m: int, k: int, gen: torch.Generator, spread: int = 12) -> torch.Tensor:
    """float32 [m, k] normal values, each row scaled by its own 2**j, |j| <= spread."""
    return torch.randn(m, k, generator=gen) * torch.randint(-spread, spread + 1, (m, 1), generator=gen).to(torch.float32).exp2()


def norm_rows(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """float32 [m + 8, k]: random rows, then a zero row, -0.0s, one NaN, +inf, subnormals, huge
    values (x**2 overflows: rstd = 0), and squares that tie in float32: the last row's sum of
    squares, 2**24 and 1s, depends on the order (the specified tree adds the 1s before 2**24;
    added one by one to 2**24 they would round away)."""
    x = magnitudes(m, k, gen)
    tiny = torch.finfo(torch.float32).tiny
    special = torch.stack([
        torch.zeros(k),
        torch.full((k,), -0.0),
        torch.randn(k, generator=gen).index_fill_(0, torch.tensor([k // 2]), float("nan")),
        torch.randn(k, generator=gen).index_fill_(0, torch.tensor([1]), float("inf")),
        torch.randn(k, generator=gen) * tiny * 2**-10,
        torch.randn(k, generator=gen) * 1e30,
        torch.where(torch.arange(k) % 3 == 0, 4096.0, 1.0),
        torch.where(torch.arange(k) >= 64, 1.0, 0.0).index_fill_(0, torch.tensor([0]), 4096.0),
    ])  # fmt: skip
    return torch.cat([x, special])


def act_rows(m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """float32 [m + 2, n]: random rows of mixed magnitude (SiLU's exp saturates both ways, the
    SwiGLU limit 7 clips), then rows of special values: NaN, +-inf, -0.0, subnormals, exp's
    overflow edge, the limit itself and its neighbours."""
    x = magnitudes(m, n, gen, spread=4) * 3
    edge = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40, -1e-40, 88.72, -88.72, 89.0,
                         -104.0, 7.0, -7.0, 7.0625, -7.0625, 6.9375, 3e38, -3e38, 1.0, -1.0])  # fmt: skip
    return torch.cat([x, edge.repeat(2 * n // edge.numel() + 1)[: 2 * n].reshape(2, n)])


# ---- Triton == reference, bit for bit -----------------------------------------------------------

NORM_DTYPES = [  # (x dtype, weight dtype, order): the engine's combinations (weights.py norm()), and promotion
    (torch.bfloat16, torch.bfloat16, "hf"),
    (torch.bfloat16, torch.float32, "f32"),
    (torch.float32, torch.float32, "hf"),
    (torch.bfloat16, torch.float32, "hf"),
]


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: "-".join(f))
@pytest.mark.parametrize("dtypes", NORM_DTYPES, ids=lambda d: f"{str(d[0])[6:]}-{str(d[1])[6:]}-{d[2]}")
@pytest.mark.parametrize("which_k", [0, 1])
def test_rmsnorm_triton_equals_reference(triton_device, gen, fmt, dtypes, which_k):
    k = NORM_K[fmt[0]][which_k]
    xd, wd, order = dtypes
    x = norm_rows(5, k, gen).to(xd)
    w = (1 + 0.2 * torch.randn(k, generator=gen)).to(wd)
    ref = call("rmsnorm_act_quant", "torch", x, w, 1e-6, *fmt, order)
    out = call("rmsnorm_act_quant", "triton", x.to(triton_device), w.to(triton_device), 1e-6, *fmt, order)
    check_pair(ref, out, f"rmsnorm {fmt} {dtypes} K={k}")


@pytest.mark.parametrize("shape", [(1, 200), (2, 3, 300)])
def test_rmsnorm_triton_shapes_and_configs(triton_device, gen, shape):
    x = magnitudes(int(np.prod(shape[:-1])), shape[-1], gen).reshape(shape).to(torch.bfloat16)
    w = (1 + 0.2 * torch.randn(shape[-1], generator=gen)).to(torch.bfloat16)
    ref = call("rmsnorm_act_quant", "torch", x, w, 1e-5, "fp8-block", "float")
    assert ref[0].shape == shape and ref[1].shape == (*shape[:-1], 3 if shape[-1] > 256 else 2)
    for cfg in fused_act_quant.NORM_TUNING:
        out = call("rmsnorm_act_quant", "triton", x.to(triton_device), w.to(triton_device), 1e-5, "fp8-block", "float", **cfg)
        check_pair(ref, out, f"rmsnorm {shape} {cfg}")
    x0 = torch.zeros(0, 160, dtype=torch.bfloat16)  # no rows (mxfp8: formats.fp8_block.quantize_act cannot reshape M = 0)
    w0 = torch.ones(160, dtype=torch.bfloat16)
    check_pair(call("rmsnorm_act_quant", "torch", x0, w0, 1e-5, "mxfp8"), call("rmsnorm_act_quant", "triton", x0.to(triton_device), w0.to(triton_device), 1e-5, "mxfp8"), "M=0")


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: "-".join(f))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", ["separate", "halves"])
def test_silu_mul_triton_equals_reference(triton_device, gen, fmt, dtype, layout):
    n = ACT_I[fmt[0]]
    gu = act_rows(6, 2 * n, gen).to(dtype)  # [M, 2I] = [gate | up]
    if layout == "separate":
        g, u = gu[:, :n].contiguous(), gu[:, n:].contiguous()
    else:
        g, u = gu[:, :n], gu[:, n:]  # strided views, as a concatenated gate_up is passed
    ref = call("silu_mul_act_quant", "torch", g, u, *fmt)
    gd = gu.to(triton_device)
    args = (gd[:, :n], gd[:, n:]) if layout == "halves" else (g.to(triton_device), u.to(triton_device))
    check_pair(ref, call("silu_mul_act_quant", "triton", *args, *fmt), f"silu_mul {fmt} {dtype} {layout}")


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: "-".join(f))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_swiglu_triton_equals_reference(triton_device, gen, fmt, dtype):
    n = ACT_I[fmt[0]]
    gu = act_rows(6, 2 * n, gen).to(dtype)  # interleaved: column 2j gate, 2j+1 up
    ref = call("swiglu_act_quant", "torch", gu, *fmt)
    check_pair(ref, call("swiglu_act_quant", "triton", gu.to(triton_device), *fmt), f"swiglu {fmt} {dtype}")
    ref = call("swiglu_act_quant", "torch", gu, *fmt, 1.5, 2.5)  # other alpha / limit
    check_pair(ref, call("swiglu_act_quant", "triton", gu.to(triton_device), *fmt, 1.5, 2.5), f"swiglu {fmt} {dtype} a=1.5 l=2.5")


@pytest.mark.parametrize("op", ["silu_mul_act_quant", "swiglu_act_quant"])
def test_activation_triton_shapes_and_configs(triton_device, gen, op):
    x = (3 * torch.randn(2, 3, 320, generator=gen)).to(torch.bfloat16)  # 3-D; I = 160 (fp8-block) or 160 interleaved
    args = (x[..., :160], x[..., 160:]) if op == "silu_mul_act_quant" else (x,)
    ref = call(op, "torch", *args, "fp8-block")
    assert ref[0].shape == (2, 3, 160) and ref[1].shape == (2, 3, 2)
    dev = tuple(a.to(triton_device) for a in args)
    for cfg in fused_act_quant.ACT_TUNING:
        check_pair(ref, call(op, "triton", *dev, "fp8-block", **cfg), f"{op} {cfg}")
    for m in (1, 0):
        one = tuple(a[0, :m] for a in args)
        check_pair(call(op, "torch", *one, "mxfp8"), call(op, "triton", *(a.to(triton_device) for a in one), "mxfp8"), f"{op} M={m}")


# ---- the references against the engine's unfused path -------------------------------------------


def bf16_all() -> torch.Tensor:
    """Every bfloat16 bit pattern."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("n", [65536, 1001, 7])  # torch's vectorised body and its scalar tail
def test_silu_and_sigmoid_equal_torch_on_every_bf16(n):
    g = bf16_all()[torch.randperm(65536, generator=torch.Generator().manual_seed(n))[:n]]
    assert_same(F.silu(g), R.silu_f32(g.float()).to(torch.bfloat16), "silu")
    assert_same(torch.sigmoid(g), R.sigmoid_f32(g.float()).to(torch.bfloat16), "sigmoid")


def test_exp_within_one_ulp_and_edges():
    x = torch.cat([torch.linspace(-103.9, 88.7, 400_001), torch.randn(100_000) * 5])
    want = torch.exp(x.double()).float()  # correctly rounded but for double-rounding ties
    got = R.exp_f32(x)
    ulps = (got.view(torch.int32).long() - want.view(torch.int32).long()).abs()
    assert ulps.max() <= 1 and (ulps == 0).float().mean() > 0.85, ulps.max()
    edge = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 88.73, 89.0, 1000.0, -104.0, -1000.0])
    out = R.exp_f32(edge)
    assert out[:2].tolist() == [1.0, 1.0] and out[2] == float("inf") and out[3] == 0 and out[4].isnan()
    assert out[5:8].isinf().all() and (out[8:] == 0).all()


def test_sqrt_is_ieee():
    v = torch.rand(100_000) * 1000
    assert torch.equal(R.sqrt_f32(v), torch.from_numpy(np.sqrt(v.numpy())))  # numpy's float32 sqrt is IEEE


def _spec_sum_squares(row: np.ndarray) -> np.float32:
    """The specified order, in numpy float32 scalars: 128 lanes in sequence, then pairwise."""
    lanes = [np.float32(0)] * 128
    for j, v in enumerate(row.astype(np.float32)):
        lanes[j % 128] = np.float32(lanes[j % 128] + np.float32(v * v))
    while len(lanes) > 1:
        lanes = [np.float32(lanes[i] + lanes[i + 1]) for i in range(0, len(lanes), 2)]
    return lanes[0]


def test_sum_squares_order(gen):
    x = torch.zeros(2, 128)
    x[:, 0] = 4096.0  # 2**24: adding 1 to it rounds back (ties to even); adding 2 is exact
    x[0, 64], x[0, 65] = 1.0, 1.0  # paired first: 1 + 1 = 2, then 2**24 + 2
    x[1, 1], x[1, 64] = 1.0, 1.0  # each meets 2**24 alone: 2**24
    assert R.sum_squares(x).tolist() == [2.0**24 + 2, 2.0**24]
    y = magnitudes(3, 300, gen)
    assert [float(_spec_sum_squares(r)) for r in y.numpy()] == R.sum_squares(y).tolist()


@pytest.mark.parametrize("order", ["hf", "f32"])
def test_rmsnorm_reference_vs_engine_norm(gen, order):
    """bfloat16: the specified sum of squares changes at most one bf16 ulp, rarely (measured at
    K = 256..7168: <= 2e-5 of the elements; bound 1e-3); the quantized bytes move by at most one
    E4M3 step.  float32: relative 1e-6 (a few ulps)."""
    k = 300
    x = magnitudes(256, k, gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(k, generator=gen)).to(torch.float32 if order == "f32" else torch.bfloat16)
    engine = RMSNorm(w, 1e-6, order)(x)
    spec = R.rms_norm(x, w, 1e-6, order)
    ulps = (engine.view(torch.int16).int() - spec.view(torch.int16).int()).abs()
    assert ulps.max() <= 1 and (ulps > 0).float().mean() <= 1e-3
    qe, se = fp8_block.quantize_act(engine)
    qs, ss = call("rmsnorm_act_quant", "torch", x, w, 1e-6, "fp8-block", "float", "rceil", order)
    assert (qe.view(torch.uint8).int() - qs.view(torch.uint8).int()).abs().max() <= 1
    assert ((se - ss).abs() / se).max() <= 2**-7
    xf = x.float()
    torch.testing.assert_close(R.rms_norm(xf, w.float(), 1e-6, order), RMSNorm(w.float(), 1e-6, order)(xf), rtol=1e-6, atol=0)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: "-".join(f))
def test_activation_references_are_the_unfused_path_in_bf16(gen, fmt):
    n = ACT_I[fmt[0]]
    gu = act_rows(40, 2 * n, gen).to(torch.bfloat16)
    g, u = gu[:, :n], gu[:, n:]
    q = R.act_quant(F.silu(g) * u, *fmt)  # the engine's MLP, then its act_quant
    check_pair(q, call("silu_mul_act_quant", "torch", g, u, *fmt), f"silu_mul {fmt}")
    want = activation(gu[:, 0::2], gu[:, 1::2], MoeSpec("gpt-oss", True))  # the engine's expert activation
    check_pair(R.act_quant(want, *fmt), call("swiglu_act_quant", "torch", gu, *fmt), f"swiglu {fmt}")


def test_activation_references_in_f32_within_an_ulp(gen):
    """float32: the specified exp moves SiLU by at most an ulp (2**-23 relative)."""
    g, u = (magnitudes(64, 96, gen, spread=3) for _ in range(2))
    torch.testing.assert_close(R.silu_mul(g, u), F.silu(g) * u, rtol=2**-22, atol=1e-38)
    gu = torch.stack([g, u], -1).flatten(-2)
    want = activation(g, u, MoeSpec("gpt-oss", True))
    torch.testing.assert_close(R.swiglu(gu), want, rtol=2**-21, atol=1e-38)


# ---- the engine's MLP ------------------------------------------------------------------------------


def _dense_mlp(gen: torch.Generator, fmt: str, act: ActQuant, h: int = 64, inter: int = 160) -> mlp_layer.MLP:
    def lin(n: int, k: int) -> Linear:
        w = 0.1 * torch.randn(n, k, generator=gen)
        return Linear(Fp8Block(*fp8_block.quantize_weight(w, act.scale_fmt), act) if fmt == "fp8-block" else Mxfp8(*mxfp8.quantize(w), act))

    return mlp_layer.MLP(lin(inter, h), lin(inter, h), lin(h, inter))


@pytest.mark.parametrize("act", [ActQuant("fp8-block"), ActQuant("fp8-block", "ue8m0"), ActQuant("mxfp8", rule="floor")], ids=lambda a: f"{a.kind}-{a.scale_fmt}")
def test_mlp_fused_equals_unfused_in_bf16(gen, triton_device, act):
    mlp = _dense_mlp(gen, act.kind, act)
    x = (2 * torch.randn(9, 64, generator=gen)).to(torch.bfloat16)
    y = mlp(x)
    assert mlp.down_proj.weight.ops.last_backend("silu_mul_act_quant") == "torch"
    assert_same(mlp.unfused(x), y, "MLP fused vs unfused")
    xf = x.float()
    mlp.down_proj.weight.ops.ran.clear()
    assert_same(mlp.unfused(xf), mlp(xf), "MLP float32 (unfused)")
    assert "silu_mul_act_quant" not in mlp.down_proj.weight.ops.ran  # float32 keeps torch's silu
    if triton_device.type == "cpu":  # the interpreter: the same bytes through the Triton backend
        mlp.down_proj.weight.ops.per_op["silu_mul_act_quant"] = "triton"
        assert_same(y, mlp(x), "MLP with the Triton silu_mul_act_quant")


@pytest.mark.parametrize("scale_fmt", ["float", "ue8m0"])
def test_deepseek_logits_fused_equal_unfused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale_fmt: str):
    """A DeepSeek-V3 checkpoint (ragged: dense I = 448, shared expert I = 192, partial 128-groups) in
    bfloat16: the dense layer and the shared experts run silu_mul_act_quant; logits identical."""
    from quantkit.engine import load
    from quantkit.synth import synthesize

    synthesize("deepseek-v3", tmp_path / "ds", preset="tiny-ragged", scale_fmt=scale_fmt)
    ids = torch.arange(1, 60, 4)
    model = load(tmp_path / "ds", "cpu", torch.bfloat16)
    with torch.no_grad():
        fused = model(ids)
    assert model.ops.ran["silu_mul_act_quant"] == "torch"
    monkeypatch.setattr(mlp_layer.MLP, "forward", mlp_layer.MLP.unfused)
    with torch.no_grad():
        unfused = load(tmp_path / "ds", "cpu", torch.bfloat16)(ids)
    assert torch.equal(fused, unfused), (fused - unfused).abs().max().item()


def test_linear_quantized_checks_its_input(gen):
    act = ActQuant("fp8-block")
    w = Linear(Fp8Block(*fp8_block.quantize_weight(torch.randn(32, 200, generator=gen)), act))
    x = torch.randn(3, 200, generator=gen)
    a, s = fp8_block.quantize_act(x)
    assert torch.equal(w.quantized(a, s, torch.float32), w(x))
    with pytest.raises(ValueError, match=r"takes E4M3 \[\.\.\., 200\] \+ torch.float32 scales \[\.\.\., 2\]"):
        w.quantized(*mxfp8.quantize(x[:, :192]), torch.float32)
    with pytest.raises(ValueError, match="takes E4M3"):
        w.quantized(a, s[:, :1], torch.float32)
    with pytest.raises(ValueError, match="without activation quantization"):
        Linear(Dense(torch.randn(32, 200))).quantized(a, s, torch.float32)


# ---- rejected inputs ---------------------------------------------------------------------------------

X, W = torch.randn(2, 64), torch.ones(64)
BAD_NORM = [
    ((X, torch.ones(63), 1e-6, "fp8-block"), "weight \\[K\\]"),
    ((torch.randn(2, 0), torch.ones(0), 1e-6, "fp8-block"), "K > 0"),
    ((X.half(), W, 1e-6, "fp8-block"), "dtype must be one of"),
    ((X, W, 0.0, "fp8-block"), "eps must be positive"),
    ((X, W, 1e-6, "nvfp4"), "activation format must be one of"),
    ((X, W, 1e-6, "fp8-block", "e8m0"), "scale format must be one of"),
    ((X, W, 1e-6, "mxfp8", "float", "ceil"), "scale rule must be one of"),
    ((X, W, 1e-6, "fp8-block", "float", "rceil", "llama"), "RMSNorm order must be one of"),
    ((torch.randn(2, 48), torch.ones(48), 1e-6, "mxfp8"), "multiple of 32, got 48"),
]
BAD_ACT = [
    ("silu_mul_act_quant", (torch.randn(2, 64), torch.randn(2, 32), "fp8-block"), "one shape and dtype"),
    ("silu_mul_act_quant", (torch.randn(2, 64), torch.randn(2, 64).bfloat16(), "fp8-block"), "one shape and dtype"),
    ("silu_mul_act_quant", (torch.randn(2, 64).half(), torch.randn(2, 64).half(), "fp8-block"), "dtype must be one of"),
    ("silu_mul_act_quant", (torch.randn(2, 48), torch.randn(2, 48), "mxfp8"), "multiple of 32, got 48"),
    ("swiglu_act_quant", (torch.randn(2, 63), "fp8-block"), "\\[\\.\\.\\., 2I\\]"),
    ("swiglu_act_quant", (torch.randn(2, 96), "mxfp8"), "multiple of 32, got 48"),
    ("swiglu_act_quant", (torch.randn(2, 64), "fp8-block", "float", "nearest"), "scale rule must be one of"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("args", "msg"), BAD_NORM, ids=[m for _, m in BAD_NORM])
def test_rmsnorm_rejects(triton_device, backend, args, msg):
    args = tuple(a.to(triton_device) if isinstance(a, torch.Tensor) else a for a in args) if backend == "triton" else args
    with pytest.raises(ValueError, match=msg):
        call("rmsnorm_act_quant", backend, *args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("op", "args", "msg"), BAD_ACT, ids=[f"{o}-{m}" for o, _, m in BAD_ACT])
def test_activation_rejects(triton_device, backend, op, args, msg):
    args = tuple(a.to(triton_device) if isinstance(a, torch.Tensor) else a for a in args) if backend == "triton" else args
    with pytest.raises(ValueError, match=msg):
        call(op, backend, *args)


def test_ops_registered_with_reference_first():
    for op in R.OPS:
        assert dispatch.backends(op)[-1] == "torch" and "triton" in dispatch.backends(op)
        assert dispatch.which(op, "cpu") == "torch"  # auto never picks the interpreter


# ---- full size on the GPU (pytest -m gpu) -------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cuda_rows(m: int, k: int, spread: int = 10) -> torch.Tensor:
    """bf16 [m, k] on the GPU, each row scaled by its own 2**j, |j| <= spread."""
    g = torch.Generator(device="cuda").manual_seed(0)
    mag = torch.randint(-spread, spread + 1, (m, 1), device="cuda", generator=g).to(torch.float32).exp2()
    return (torch.randn(m, k, device="cuda", generator=g) * mag).to(torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fmt", FMTS[:2] + FMTS[3:4], ids=lambda f: "-".join(f))
@pytest.mark.parametrize("order", ["hf", "f32"])
@pytest.mark.parametrize("m", [4096, 1])
def test_rmsnorm_full_size_gpu(fmt, order, m):
    """DeepSeek-V3's hidden 7168: compiled Triton == the reference on the GPU, every launch config;
    the reference on the GPU == on the CPU (first rows)."""
    x = _cuda_rows(m, 7168)
    w = (1 + 0.1 * _cuda_rows(1, 7168, 0)[0].float()).to(torch.float32 if order == "f32" else torch.bfloat16)
    ref = call("rmsnorm_act_quant", "torch", x, w, 1e-6, *fmt, order)
    for cfg in fused_act_quant.NORM_TUNING:
        check_pair(ref, call("rmsnorm_act_quant", "triton", x, w, 1e-6, *fmt, order, **cfg), f"rmsnorm M={m} {fmt} {order} {cfg}")
    cpu = call("rmsnorm_act_quant", "torch", x[:64].cpu(), w.cpu(), 1e-6, *fmt, order)
    check_pair(cpu, tuple(t[:64].cpu() for t in ref), "rmsnorm reference CPU vs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fmt", FMTS[:2] + FMTS[3:4], ids=lambda f: "-".join(f))
@pytest.mark.parametrize(("op", "inter"), [("silu_mul_act_quant", 2048), ("swiglu_act_quant", 2880)])
def test_activation_full_size_gpu(fmt, op, inter):
    """M = 4096: DeepSeek's expert I = 2048 as [gate | up] halves, GPT-OSS's I = 2880 interleaved."""
    gu = 3 * _cuda_rows(4096, 2 * inter, 3)  # [M, 2I]
    args = (gu[:, :inter], gu[:, inter:]) if op == "silu_mul_act_quant" else (gu,)
    ref = call(op, "torch", *args, *fmt)
    for cfg in fused_act_quant.ACT_TUNING:
        check_pair(ref, call(op, "triton", *args, *fmt, **cfg), f"{op} I={inter} {fmt} {cfg}")
    cpu = call(op, "torch", *(a[:64].cpu() for a in args), *fmt)
    check_pair(cpu, tuple(t[:64].cpu() for t in ref), f"{op} reference CPU vs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_silu_and_sigmoid_equal_torch_cuda_on_every_bf16():
    """What lets the dense MLP fuse in bfloat16 on the GPU (the CPU twin is tested above)."""
    g = bf16_all().cuda()
    assert_same(F.silu(g), R.silu_f32(g.float()).to(torch.bfloat16), "silu (CUDA)")
    assert_same(torch.sigmoid(g), R.sigmoid_f32(g.float()).to(torch.bfloat16), "sigmoid (CUDA)")
