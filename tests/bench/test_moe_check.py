"""quantkit.bench.moe: the experts are the same on every run, and the check passes a few E4M3 rounding flips but
fails anything a bug would do."""

from __future__ import annotations

import torch

from quantkit.bench import moe as bench_moe


def test_experts_come_from_a_fixed_seed():
    m = bench_moe.CPU_MODELS["gpt-oss-120b"]
    torch.manual_seed(1)
    a = bench_moe.model_experts(torch, "fp8-block", m, torch.device("cpu"))
    torch.manual_seed(2)  # the global RNG no longer matters
    b = bench_moe.model_experts(torch, "fp8-block", m, torch.device("cpu"))
    for x, y in ((a.w13.q, b.w13.q), (a.w13.scale, b.w13.scale), (a.w13.bias, b.w13.bias), (a.w2.q, b.w2.q), (a.w2.scale, b.w2.scale)):
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x, y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y)
    xa, wa, ia = bench_moe.tokens(torch, a, 3, torch.device("cpu"))
    xb, wb, ib = bench_moe.tokens(torch, b, 3, torch.device("cpu"))
    assert torch.equal(xa, xb) and torch.equal(wa, wb) and torch.equal(ia, ib)


def _ref(t: int = 400, h: int = 300) -> torch.Tensor:
    return torch.randn(t, h, generator=torch.Generator().manual_seed(0))


def _bound(ref: torch.Tensor) -> torch.Tensor:
    return 2.0**-7 * ref.abs() + 1e-2 * ref.abs().max()


def test_check_passes_equal_and_a_single_flip():
    ref = _ref()
    check = bench_moe.moe_check(torch, ref)
    assert check(ref.clone()).startswith("ok")
    out = ref.clone()
    out[7, 11] += 2.0 * _bound(ref)[7, 11]  # one output a step past the bound: an E4M3 flip upstream
    verdict = check(out)
    assert verdict.startswith("ok") and "1 past the bound" in verdict, verdict


def test_check_fails_a_far_outlier_many_outliers_and_a_layout_bug():
    ref = _ref()
    check = bench_moe.moe_check(torch, ref)
    far = ref.clone()
    far[3, 5] += 5.0 * _bound(ref)[3, 5]  # beyond FLIP_EXCESS
    assert check(far).startswith("FAIL")
    many = ref.clone()
    many[::20] += 1.5 * _bound(ref)[::20]  # 5% of the outputs past the bound, each by 1.5x: not a few flips
    assert check(many).startswith("FAIL")
    assert check(ref[:, torch.randperm(ref.shape[1], generator=torch.Generator().manual_seed(1))]).startswith("FAIL")  # columns swapped
    assert check(torch.full_like(ref, float("nan"))).startswith("FAIL")
