"""``rope_rotate`` and ``add_rmsnorm`` (quantkit/kernels/step_ref.py, step_triton.py): the Triton kernels give
their references' bytes (in the interpreter on the CPU, compiled on a GPU), the references are the engine's
unfused ops (the rotation exactly, RMSNorm to its specified sum order), and bad input fails loudly.
Budget: under 30 s on 2 cores."""

from __future__ import annotations

import pytest
import torch

from quantkit.engine.layers.norm import RMSNorm
from quantkit.engine.layers.rope import Rope
from quantkit.kernels import dispatch, step_ref

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
    assert same(step_ref.rope_rotate(x, cos[:, 0], sin[:, 0], style), rope(x, pos))


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 8, 64), (3, 16, 64), (2, 1, 64), (4, 3, 24)])
def test_rope_triton_bytes_equal_reference(shape, dtype, style):
    t, h, d = shape
    g = torch.Generator().manual_seed(1)
    big = (torch.randn(t, h + 2, d + 8, generator=g) * 3).to(dtype)
    x = big[:, 1 : h + 1, 4 : 4 + d]  # strided view, unit stride along D (MLA's q_rot is one)
    cos, sin = table(t, d, dtype)
    want = step_ref.rope_rotate(x, cos, sin, style)
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
    want = step_ref.add_rmsnorm(x, y, w, 1e-5, order)
    for tuning in ({"block_m": 2, "unroll": 2, "block_k": 128}, {}):  # a narrow launch and the default one
        got = dispatch.call("add_rmsnorm", x, y, w, 1e-5, order, backend="triton", **tuning)
        assert same(got[0], want[0]) and same(got[1], want[1]), tuning
    # against the engine's unfused add and RMSNorm: the sum exactly; the norm to the last bits of the mean
    s = x + y
    assert same(want[0], s)
    ref = RMSNorm(w, 1e-5, order)(s).float()
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-20
    assert ((want[1].float() - ref).abs() <= ulp * ref.abs().clamp_min(1e-3)).float().mean() == 1.0


def test_bad_input_is_refused():
    x = torch.randn(2, 3, 64)
    cos, sin = table(2, 64, torch.float32)
    with pytest.raises(ValueError, match="rope style"):
        step_ref.rope_rotate(x, cos, sin, "neox")
    with pytest.raises(ValueError, match="cos and sin"):
        step_ref.rope_rotate(x, cos[:1], sin[:1])
    with pytest.raises(ValueError, match="one shape and dtype"):
        step_ref.add_rmsnorm(torch.randn(2, 8), torch.randn(2, 8).bfloat16(), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="promote"):
        step_ref.add_rmsnorm(torch.randn(2, 8).bfloat16(), torch.randn(2, 8).bfloat16(), torch.ones(8), 1e-6, "hf")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_compiled_bytes_equal_reference(dtype):
    g = torch.Generator().manual_seed(3)
    for style, (t, h, d) in [("half", (256, 64, 64)), ("half", (1, 8, 64)), ("interleaved", (33, 128, 64)), ("half", (7, 32, 128))]:
        x = (torch.randn(t, h, d, generator=g) * 3).to(dtype)
        cos, sin = table(t, d, dtype)
        want = step_ref.rope_rotate(x, cos, sin, style)
        got = dispatch.call("rope_rotate", x.cuda(), cos.cuda(), sin.cuda(), style)
        assert dispatch.which("rope_rotate", "cuda") == "triton" and same(got.cpu(), want), (style, t, h, d)
    for shape, order in [((1, 2880), "f32"), ((256, 2880), "f32"), ((37, 7168), "hf"), ((64, 4096), "hf")]:
        x, y = ((torch.randn(shape, generator=g) * 4).to(dtype) for _ in range(2))
        w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
        want = step_ref.add_rmsnorm(x, y, w, 1e-6, order)
        got = dispatch.call("add_rmsnorm", x.cuda(), y.cuda(), w.cuda(), 1e-6, order)
        assert same(got[0].cpu(), want[0]) and same(got[1].cpu(), want[1]), (shape, order)
