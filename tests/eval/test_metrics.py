"""The llama.cpp --kl-divergence statistics against hand computations on tiny distributions."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from quantkit.eval.metrics import Accumulator, covariance, mean_and_uncertainty, median, percentile, token_metrics


def logits_of(*probs: float) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs], dtype=torch.float64)


def test_identical_logits_give_zero_kld_full_top1_unit_ratio(gen):
    ref = torch.randn(40, 17, generator=gen)
    targets = torch.randint(0, 17, (40,), generator=gen)
    acc = Accumulator()
    acc.add_logits(ref, ref.clone(), targets)
    s = acc.summary()
    assert s.kld_mean == pytest.approx(0.0, abs=1e-15) and s.kld_max == pytest.approx(0.0, abs=1e-15)
    assert s.top1_pct == 100.0 and s.top1_err_pct == 0.0
    assert s.ppl_ratio == pytest.approx(1.0, abs=1e-15) and s.ln_ppl_ratio_err == pytest.approx(0.0, abs=1e-7)
    assert s.rms_dp_pct == 0.0 and s.max_abs_dlogit == 0.0
    assert s.ppl_ref == s.ppl_cand


def test_two_token_closed_form():
    # p = (3/4, 1/4), q = (2/5, 3/5): KL = 3/4 ln(15/8) + 1/4 ln(5/12); the argmax differs
    ref, cand = logits_of(0.75, 0.25)[None], logits_of(0.4, 0.6)[None]
    m = token_metrics(ref, cand, torch.tensor([0]))
    assert float(m["kld"][0]) == pytest.approx(0.75 * math.log(15 / 8) + 0.25 * math.log(5 / 12), rel=1e-12)
    assert float(m["nll_ref"][0]) == pytest.approx(-math.log(0.75), rel=1e-12)
    assert float(m["nll_cand"][0]) == pytest.approx(-math.log(0.4), rel=1e-12)
    assert float(m["p_diff"][0]) == pytest.approx(0.4 - 0.75, rel=1e-12)  # candidate minus reference
    assert not bool(m["same_top"][0])
    assert float(m["max_abs_dlogit"]) == pytest.approx(max(abs(math.log(0.75 / 0.4)), abs(math.log(0.25 / 0.6))), rel=1e-12)


def test_kld_direction_is_reference_first():
    # KL(p||q) != KL(q||p): the reference distribution weights the sum
    p, q = logits_of(0.9, 0.1)[None], logits_of(0.5, 0.5)[None]
    kpq = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert float(token_metrics(p, q, torch.tensor([0]))["kld"][0]) == pytest.approx(kpq, rel=1e-12)
    assert float(token_metrics(q, p, torch.tensor([0]))["kld"][0]) != pytest.approx(kpq, rel=1e-3)


def test_kld_matches_torch_kl_div(gen):
    ref, cand = torch.randn(37, 50, generator=gen) * 3, torch.randn(37, 50, generator=gen) * 3
    m = token_metrics(ref, cand, torch.zeros(37, dtype=torch.long))
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(cand.double(), -1)
    expect = torch.nn.functional.kl_div(lq, lp, reduction="none", log_target=True).sum(-1)
    torch.testing.assert_close(m["kld"], expect, rtol=1e-12, atol=1e-14)


def test_logit_shift_leaves_distribution_metrics_but_not_max_dlogit(gen):
    ref = torch.randn(12, 9, generator=gen, dtype=torch.float64)
    m = token_metrics(ref, ref + 3.0, torch.zeros(12, dtype=torch.long))
    assert float(m["kld"].abs().max()) < 1e-14 and bool(m["same_top"].all())
    assert float(m["max_abs_dlogit"]) == pytest.approx(3.0)


def test_summary_aggregates_by_hand():
    # four tokens over a 2-token vocabulary; candidate agrees on the argmax for 3 of them
    ref = torch.stack([logits_of(0.75, 0.25), logits_of(0.75, 0.25), logits_of(0.2, 0.8), logits_of(0.6, 0.4)])
    cand = torch.stack([logits_of(0.5, 0.5), logits_of(0.75, 0.25), logits_of(0.1, 0.9), logits_of(0.3, 0.7)])
    targets = torch.tensor([0, 1, 1, 0])
    acc = Accumulator()
    acc.add_logits(ref[:2], cand[:2], targets[:2])  # two windows: results must not depend on the split
    acc.add_logits(ref[2:], cand[2:], targets[2:])
    s = acc.summary()
    kl = [0.75 * math.log(1.5) + 0.25 * math.log(0.5), 0.0,
          0.2 * math.log(2) + 0.8 * math.log(8 / 9), 0.6 * math.log(2) + 0.4 * math.log(4 / 7)]
    assert s.n_tokens == 4
    assert s.kld_mean == pytest.approx(sum(kl) / 4, rel=1e-12)
    assert s.kld_err == 0.0  # llama.cpp reports no uncertainty for N <= 10
    assert s.kld_max == pytest.approx(max(kl), rel=1e-12)
    assert s.kld_median == pytest.approx(statistics.median(kl), rel=1e-12)
    # tie (0.5, 0.5): argmax takes the first index, as llama.cpp's strict '>' scan does -> agrees
    assert s.top1_pct == pytest.approx(75.0)
    assert s.top1_err_pct == pytest.approx(100 * math.sqrt(0.75 * 0.25 / 3))
    p_ref, p_cand = [0.75, 0.25, 0.8, 0.6], [0.5, 0.25, 0.9, 0.3]
    dp = [c - r for c, r in zip(p_cand, p_ref)]
    assert s.rms_dp_pct == pytest.approx(100 * math.sqrt(sum(d * d for d in dp) / 4), rel=1e-12)
    ppl_ref = math.exp(-sum(map(math.log, p_ref)) / 4)
    ppl_cand = math.exp(-sum(map(math.log, p_cand)) / 4)
    assert s.ppl_ref == pytest.approx(ppl_ref, rel=1e-12) and s.ppl_cand == pytest.approx(ppl_cand, rel=1e-12)
    assert s.ppl_ratio == pytest.approx(ppl_cand / ppl_ref, rel=1e-12)


def test_mean_and_uncertainty_formula():
    x = torch.arange(1, 21, dtype=torch.float64) ** 1.5
    n = x.numel()
    mean, err = mean_and_uncertainty(x)
    pop_var = float(np.var(x.numpy()))  # Σx²/N - mean², llama.cpp's "df"
    assert mean == pytest.approx(float(np.mean(x.numpy())), rel=1e-14)
    assert err == pytest.approx(math.sqrt(pop_var / (n - 1)), rel=1e-12)
    assert mean_and_uncertainty(x[:10]) == (pytest.approx(float(x[:10].mean())), 0.0)  # N <= 10: no error
    assert mean_and_uncertainty(torch.full((50,), 2.5)) == (2.5, 0.0)


def test_percentile_is_linear_interpolation_like_numpy(gen):
    v = torch.rand(1001, generator=gen, dtype=torch.float64).sort().values
    for f in (0.999, 0.99, 0.95, 0.9, 0.5, 0.1):
        assert percentile(v, f) == pytest.approx(float(np.percentile(v.numpy(), 100 * f)), rel=1e-12)
    assert percentile(v, 0.0) == float(v[0]) and percentile(v, 1.0) == float(v[-1])
    assert median(torch.tensor([1.0, 2.0, 4.0, 10.0])) == 3.0 and median(torch.tensor([1.0, 2.0, 4.0])) == 2.0


def test_covariance_and_ppl_ratio_uncertainty(gen):
    a = torch.rand(200, generator=gen, dtype=torch.float64) * 3
    b = a + 0.1 * torch.rand(200, generator=gen, dtype=torch.float64)
    n = 200
    cov = float(np.cov(a.numpy(), b.numpy(), bias=True)[0, 1]) / (n - 1)
    assert covariance(a, b) == pytest.approx(cov, rel=1e-10)
    assert covariance(a[:9], b[:9]) == 0.0


def test_hidden_relative_error_per_layer():
    acc = Accumulator()
    r0, r1 = torch.tensor([[3.0, 4.0]]), torch.tensor([[1.0, 0.0]])
    acc.add_hidden([r0, r1], [r0 + torch.tensor([[0.0, 0.5]]), r1])
    acc.add_hidden([r0, r1], [r0, r1 * 2])
    acc.add_logits(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([0]))
    s = acc.summary()
    assert s.hidden_rel_err[0] == pytest.approx(math.sqrt(0.25 / 50))
    assert s.hidden_rel_err[1] == pytest.approx(math.sqrt(1.0 / 2))


def test_mismatches_are_errors():
    acc = Accumulator()
    with pytest.raises(ValueError, match="layer indexing"):
        acc.add_hidden([torch.zeros(2, 3)] * 3, [torch.zeros(2, 3)] * 2)
    with pytest.raises(ValueError, match="hidden state 0"):
        acc.add_hidden([torch.zeros(2, 3)], [torch.zeros(2, 4)])
    with pytest.raises(ValueError, match="logits shapes"):
        token_metrics(torch.zeros(2, 5), torch.zeros(2, 6), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="no scored tokens"):
        Accumulator().summary()
