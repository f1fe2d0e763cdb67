"""The stochastic E4M3 bytes of the Triton kernels (triton_numerics.e4m3_code_stochastic, integer
arithmetic on the float32 bits, and e4m3_code_stochastic_hw, the float pipe plus the sm_90
hardware cast, on the GPU) against formats.fp8.round_e4m3_given, given the same 20 random
bits, over a sweep of float32 bit patterns of every binade (float32 subnormals, E4M3 subnormals,
the 448 clamp, inf, NaN) and random bits at 0, at 2**20 - 1 and straddling each element's
threshold; and that reference against exact rational arithmetic on a sample."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import triton
import triton.language as tl

from quantkit.formats import fp8
from quantkit.kernels.triton_numerics import e4m3_code_stochastic, e4m3_code_stochastic_hw, hw_e4m3

from .kernel_cases import assert_same

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


@triton.jit
def _code_kernel(v_ptr, r_ptr, out_ptr, n, BLOCK: tl.constexpr, HW: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(v_ptr + i, mask=m, other=0.0)
    r = tl.load(r_ptr + i, mask=m, other=0).to(tl.uint32, bitcast=True)
    if HW:
        code = e4m3_code_stochastic_hw(v, r)
    else:
        code = e4m3_code_stochastic(v, r)
    tl.store(out_ptr + i, code, mask=m)


def kernel_codes(v: torch.Tensor, r: torch.Tensor, device: torch.device, hw: bool = False) -> torch.Tensor:
    out = torch.empty(v.shape, dtype=torch.uint8, device=device)
    _code_kernel[(triton.cdiv(v.numel(), 1024),)](v.to(device), r.to(device), out, v.numel(), BLOCK=1024, HW=hw)
    return out.cpu().view(torch.float8_e4m3fn)


def frac20(v: torch.Tensor) -> torch.Tensor:
    """frac(|v| / ulp) * 2**20 rounded down (int64), in float64 (exact here)."""
    a = v.clamp(-448.0, 448.0).abs().double()
    e = (torch.frexp(a)[1] - 1).clamp(min=-6)
    t = a * torch.pow(2.0, (3 - e).double())
    return torch.floor((t - torch.floor(t)) * 2.0**20).to(torch.int64)


def sweep_values() -> torch.Tensor:
    """float32 patterns: every 16411th bit pattern of each sign (all exponents, NaN, inf) and the
    powers of two and their neighbours around the E4M3 range."""
    pats = torch.arange(0, 2**31, 16411, dtype=torch.int64)
    pats = torch.cat([pats, pats | 2**31]).to(torch.int32)
    p2 = torch.tensor([2.0**k for k in range(-149, 10)], dtype=torch.float32)
    near = torch.cat([p2, torch.nextafter(p2, torch.zeros(1)), torch.nextafter(p2, torch.full((1,), 1e30)), p2 * 1.5, p2 * 1.9375, p2 * 1.96875])
    extra = torch.tensor([0.0, -0.0, 448.0, -448.0, 449.0, 464.0, 1e30, float("inf"), -float("inf"), float("nan")])
    return torch.cat([pats.view(torch.float32), near, -near, extra])


@pytest.mark.parametrize("hw", [False, pytest.param(True, marks=pytest.mark.gpu)], ids=["integer", "hw-cast"])
@pytest.mark.parametrize("which", ["random", "zero", "max", "threshold", "below-threshold"])
def test_kernel_byte_equals_reference(triton_device, which, hw):
    if hw and not hw_e4m3(triton_device):
        pytest.skip("the float-pipe byte needs the exact hardware cast (compiled Triton on NVIDIA sm_90+)")
    v = sweep_values()
    g = torch.Generator().manual_seed(11)
    if which == "random":
        r = torch.randint(0, 2**20, v.shape, generator=g)
    elif which == "zero":
        r = torch.zeros(v.shape, dtype=torch.int64)
    elif which == "max":
        r = torch.full(v.shape, 2**20 - 1)
    else:  # the decision boundary: u equal to (or one step below) frac(t) truncated to 20 bits
        f = frac20(torch.nan_to_num(v))
        r = f if which == "threshold" else (f - 1).clamp(min=0)
    u = r.to(torch.float32) * 2.0**-20
    want = fp8.round_e4m3_given(v, u)
    got = kernel_codes(v, r.to(torch.int32), triton_device, hw)
    assert_same(want, got, f"stochastic E4M3 bytes ({which} random bits)", v)


def test_reference_against_exact_arithmetic():
    """round_e4m3_given against rationals: the result is one of the two E4M3 neighbours of the
    clamped |v|, the upper one exactly when u < (|v| - lo) / (hi - lo) truncated to 20 bits."""
    grid = sorted({Fraction(float(x)) for x in torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()})
    g = torch.Generator().manual_seed(3)
    v = torch.cat([torch.randn(300, generator=g) * 2.0 ** torch.randint(-14, 9, (300,), generator=g), torch.tensor([2.0**-10, 3 * 2.0**-12, 447.9])])
    u = torch.randint(0, 2**20, v.shape, generator=g).to(torch.float32) * 2.0**-20
    out = fp8.round_e4m3_given(v, u).float()
    for x, ui, o in zip(v.tolist(), u.tolist(), out.tolist()):
        a = min(abs(Fraction(x)), Fraction(448))
        lo = max(q for q in grid if q <= a)
        hi = min(q for q in grid if q >= a)
        want = lo if lo == hi or Fraction(ui) >= Fraction(math.floor((a - lo) / (hi - lo) * 2**20), 2**20) else hi
        assert Fraction(abs(o)) == want and (o == 0 or (o < 0) == (x < 0)), (x, ui, o, want)
