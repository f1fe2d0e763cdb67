"""Logit-level accuracy metrics, as llama.cpp's ``llama-perplexity --kl-divergence`` defines them.

Source: ggml-org/llama.cpp tools/perplexity/perplexity.cpp (``log_softmax(..., kl_divergence_result&)``,
``kl_divergence()``).  Per scored token ``t`` with reference distribution ``p`` ("base") and
candidate distribution ``q``, and the correct next token ``y``:

* KLD(t) = sum_i p_i (log p_i - log q_i)                    (natural log, nats)
* nll_ref(t) = -log p_y, nll_cand(t) = -log q_y
* Δp(t) = q_y - p_y                                        (candidate minus reference)
* same top: argmax q == argmax p                            (first index on ties, as both loops do)

Aggregates over the N scored tokens:

* mean ± uncertainty: f = Σx/N, var = Σx²/N - f², err = sqrt(var/(N-1)) when var > 0 and N > 10,
  else 0 (``mean_and_uncertainty``);
* KLD percentiles: sort, linear interpolation at fraction·(N-1) (``percentile``), median the
  middle value or the mean of the two middle values, maximum the last value;
* "Same top p" = n_same/N ± sqrt(p(1-p)/(N-1));
* "RMS Δp" = sqrt(mean Δp²), error 0.5/RMS · err(Δp²);
* PPL = exp(mean nll); PPL(cand)/PPL(ref) = exp(mean nll_cand - mean nll_ref), error
  ratio · sqrt(err_c² + err_r² - 2 cov), cov = (Σ nll_c·nll_r / N - mean_c·mean_r)/(N-1) for N >= 10.

Two deliberate differences from llama.cpp, both removing its storage approximations:
llama.cpp keeps the reference log-probabilities as 16-bit codes over the top 16 nats and drops
terms with log p < -16 from the KLD sum; here the reference logits are kept in float32 and every
term is summed in float64.

Not in llama.cpp, added here: max |Δlogit| over the scored tokens, and the per-layer hidden-state
relative error sqrt(Σ||h_cand - h_ref||²) / sqrt(Σ||h_ref||²) summed over every token of every
window (one number per layer).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

# rows of a [S, V] logits block processed at once in float64 (bounds memory for 200k vocabularies)
ROW_CHUNK = 16
PERCENTILES = (0.999, 0.99, 0.95, 0.90)


def token_metrics(ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token metrics for logits ``ref``/``cand`` [S, V] and next tokens ``targets`` [S].

    Returns float64 tensors [S]: kld, nll_ref, nll_cand, p_diff; bool [S] same_top; and the
    float64 scalar max_abs_dlogit."""
    if ref.shape != cand.shape or ref.dim() != 2:
        raise ValueError(f"logits shapes differ or are not [tokens, vocab]: {tuple(ref.shape)} vs {tuple(cand.shape)}")
    if targets.shape != ref.shape[:1]:
        raise ValueError(f"targets {tuple(targets.shape)} do not match logits {tuple(ref.shape)}")
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("kld", "nll_ref", "nll_cand", "p_diff", "same_top")}
    max_dlogit = torch.zeros((), dtype=torch.float64)
    for s in range(0, ref.shape[0], ROW_CHUNK):
        r, c = ref[s:s + ROW_CHUNK].double(), cand[s:s + ROW_CHUNK].double()
        y = targets[s:s + ROW_CHUNK].long().to(r.device).unsqueeze(1)
        lp, lq = torch.log_softmax(r, dim=-1), torch.log_softmax(c, dim=-1)
        p = lp.exp()
        # p*(log p - log q) with the 0*log 0 = 0 convention (p underflows only for gaps > ~745 nats)
        out["kld"].append(torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1).cpu())
        nr, nc = -lp.gather(1, y).squeeze(1), -lq.gather(1, y).squeeze(1)
        out["nll_ref"].append(nr.cpu())
        out["nll_cand"].append(nc.cpu())
        out["p_diff"].append((torch.exp(-nc) - torch.exp(-nr)).cpu())
        out["same_top"].append((r.argmax(-1) == c.argmax(-1)).cpu())
        max_dlogit = torch.maximum(max_dlogit, (r - c).abs().max().cpu())
    res = {k: torch.cat(v) for k, v in out.items()}
    res["max_abs_dlogit"] = max_dlogit
    return res


def mean_and_uncertainty(x: torch.Tensor) -> tuple[float, float]:
    """llama.cpp's mean ± standard error from Σx and Σx² (0 error for N <= 10 or var <= 0)."""
    n = x.numel()
    if n < 1:
        return 0.0, 0.0
    x = x.double()
    f = float(x.sum()) / n
    var = float((x * x).sum()) / n - f * f
    return f, math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0


def covariance(a: torch.Tensor, b: torch.Tensor) -> float:
    """llama.cpp's covariance of the two means (0 for N < 10)."""
    n = a.numel()
    if n < 10:
        return 0.0
    a, b = a.double(), b.double()
    return (float((a * b).sum()) / n - float(a.sum()) / n * float(b.sum()) / n) / (n - 1)


def percentile(sorted_values: torch.Tensor, fraction: float) -> float:
    """Linear interpolation at fraction·(N-1) of ascending values, as llama.cpp's ``percentile``."""
    v = sorted_values
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    pos = fraction * (v.numel() - 1)
    i = int(pos)
    w = pos - i
    return float((1 - w) * v[i] + w * v[min(i + 1, v.numel() - 1)])


def median(sorted_values: torch.Tensor) -> float:
    n = sorted_values.numel()
    if n % 2 == 0:
        return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))
    return float(sorted_values[n // 2])


@dataclass
class Summary:
    """The llama.cpp --kl-divergence statistics of one candidate (percent fields are 0-100)."""

    n_tokens: int
    kld_mean: float
    kld_err: float
    kld_max: float
    kld_p999: float
    kld_p99: float
    kld_p95: float
    kld_p90: float
    kld_median: float
    top1_pct: float
    top1_err_pct: float
    rms_dp_pct: float
    rms_dp_err_pct: float
    ppl_ref: float
    ppl_cand: float
    ln_ppl_ratio: float
    ln_ppl_ratio_err: float
    ppl_ratio: float
    ppl_ratio_err: float
    max_abs_dlogit: float
    hidden_rel_err: list[float | None] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class Accumulator:
    """Collects per-token metrics window by window, then summarizes them."""

    def __init__(self) -> None:
        self.parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("kld", "nll_ref", "nll_cand", "p_diff", "same_top")}
        self.max_abs_dlogit = 0.0
        self.hidden_d2: list[float] = []
        self.hidden_r2: list[float] = []

    def add_logits(self, ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor) -> None:
        m = token_metrics(ref, cand, targets)
        for k in self.parts:
            self.parts[k].append(m[k])
        self.max_abs_dlogit = max(self.max_abs_dlogit, float(m["max_abs_dlogit"]))

    def add_hidden(self, ref: list[torch.Tensor], cand: list[torch.Tensor]) -> None:
        """Per-layer squared error and squared reference norm; entry i of both lists is the same layer."""
        if len(ref) != len(cand):
            raise ValueError(f"reference gives {len(ref)} hidden states, candidate {len(cand)}: layer indexing differs")
        if not self.hidden_d2:
            self.hidden_d2, self.hidden_r2 = [0.0] * len(ref), [0.0] * len(ref)
        for i, (r, c) in enumerate(zip(ref, cand)):
            if r.shape != c.shape:
                raise ValueError(f"hidden state {i}: reference {tuple(r.shape)} vs candidate {tuple(c.shape)}")
            r, c = r.double(), c.double().to(r.device)
            self.hidden_d2[i] += float(((c - r) ** 2).sum())
            self.hidden_r2[i] += float((r * r).sum())

    def kld_values(self) -> torch.Tensor:
        return torch.cat(self.parts["kld"]) if self.parts["kld"] else torch.zeros(0, dtype=torch.float64)

    def summary(self) -> Summary:
        if not self.parts["kld"] or sum(t.numel() for t in self.parts["kld"]) == 0:
            raise ValueError("no scored tokens: nothing to summarize")
        cat = {k: torch.cat(v) for k, v in self.parts.items()}
        n = cat["kld"].numel()
        kld_sorted = cat["kld"].sort().values
        kld_mean, kld_err = mean_and_uncertainty(cat["kld"])
        nll_c, nll_c_err = mean_and_uncertainty(cat["nll_cand"])
        nll_r, nll_r_err = mean_and_uncertainty(cat["nll_ref"])
        cov = covariance(cat["nll_cand"], cat["nll_ref"])
        ln_ratio = nll_c - nll_r
        ln_ratio_err = math.sqrt(max(nll_c_err**2 + nll_r_err**2 - 2.0 * cov, 0.0))
        top = float(cat["same_top"].double().mean())
        mse, mse_err = mean_and_uncertainty(cat["p_diff"] ** 2)
        rms = math.sqrt(mse)
        return Summary(
            n_tokens=n,
            kld_mean=kld_mean, kld_err=kld_err, kld_max=float(kld_sorted[-1]),
            kld_p999=percentile(kld_sorted, 0.999), kld_p99=percentile(kld_sorted, 0.99),
            kld_p95=percentile(kld_sorted, 0.95), kld_p90=percentile(kld_sorted, 0.90),
            kld_median=median(kld_sorted),
            top1_pct=100.0 * top,
            top1_err_pct=100.0 * math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0,
            rms_dp_pct=100.0 * rms, rms_dp_err_pct=100.0 * (0.5 / rms * mse_err if rms > 0 else 0.0),
            ppl_ref=math.exp(nll_r), ppl_cand=math.exp(nll_c),
            ln_ppl_ratio=ln_ratio, ln_ppl_ratio_err=ln_ratio_err,
            ppl_ratio=math.exp(ln_ratio), ppl_ratio_err=math.exp(ln_ratio) * ln_ratio_err,
            max_abs_dlogit=self.max_abs_dlogit,
            hidden_rel_err=[math.sqrt(d / r) if r > 0 else None for d, r in zip(self.hidden_d2, self.hidden_r2)],
        )
