"""Reports of ``eval accuracy``: a markdown table (candidates side by side), JSON, and a PNG of the
per-token KLD distributions (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .accuracy import AccuracyReport
from .metrics import Summary

# (row label, formatter of one candidate's Summary); "\|" keeps a pipe inside a table cell
ROWS: list[tuple[str, object]] = [
    ("mean KLD", lambda s: f"{_g(s.kld_mean)} ± {_g(s.kld_err)}"),
    ("max KLD", lambda s: _g(s.kld_max)),
    ("99.9% KLD", lambda s: _g(s.kld_p999)),
    ("99.0% KLD", lambda s: _g(s.kld_p99)),
    ("95.0% KLD", lambda s: _g(s.kld_p95)),
    ("median KLD", lambda s: _g(s.kld_median)),
    ("same top-1", lambda s: f"{s.top1_pct:.3f} ± {s.top1_err_pct:.3f} %"),
    ("RMS Δp", lambda s: f"{s.rms_dp_pct:.4f} ± {s.rms_dp_err_pct:.4f} %"),
    ("PPL(cand)/PPL(ref)", lambda s: f"{s.ppl_ratio:.6f} ± {s.ppl_ratio_err:.6f}"),
    ("PPL(cand)", lambda s: f"{s.ppl_cand:.4f}"),
    ("max \\|Δlogit\\|", lambda s: _g(s.max_abs_dlogit)),
]


def _g(v: float) -> str:
    """KLD-scale numbers span 1e-9..1: fixed point above 1e-3, scientific below."""
    return f"{v:.6f}" if v == 0 or abs(v) >= 1e-3 else f"{v:.3e}"


KLD_FLOOR = 1e-12  # per-token KLD below this (incl. exact 0) is drawn at the floor of the log axis


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _layer_name(i: int) -> str:
    return "embeddings" if i == 0 else f"layer {i - 1}"


def render_markdown(rep: AccuracyReport) -> str:
    names = [c.name for c in rep.candidates]
    ppl_ref = rep.candidates[0].summary.ppl_ref if rep.candidates else math.nan
    lines = [
        "## eval accuracy",
        "",
        f"- reference: `{rep.reference}` on {rep.reference_runner}; PPL(ref) {ppl_ref:.4f}",
        f"- candidates on: {', '.join(sorted({c.runner for c in rep.candidates}))}",
        f"- data: {rep.data}; {rep.n_scored} scored tokens (second half of each window, as llama.cpp --kl-divergence)",
        "",
    ]
    rows = [[label, *(fmt(c.summary) for c in rep.candidates)] for label, fmt in ROWS]
    if any(v is not None for v in rep.gate.values()):
        rows.append(["gate", *("pass" if not c.failures else "FAIL: " + "; ".join(c.failures) for c in rep.candidates)])
    lines += _table(["metric", *names], rows)
    n_layers = max((len(c.summary.hidden_rel_err) for c in rep.candidates), default=0)
    if n_layers:
        lines += ["", "Hidden-state relative error ‖h_cand − h_ref‖ / ‖h_ref‖ (all tokens of all windows; "
                  "layer i = output of decoder layer i, before the final norm):", ""]
        cells = [[_layer_name(i), *(_fmt_rel(c.summary, i) for c in rep.candidates)] for i in range(n_layers)]
        lines += _table(["point", *names], cells)
    return "\n".join(lines) + "\n"


def _fmt_rel(s: Summary, i: int) -> str:
    v = s.hidden_rel_err[i] if i < len(s.hidden_rel_err) else None
    return "n/a" if v is None else f"{v:.3e}"


class PlotUnavailable(RuntimeError):
    """--plot was asked for but matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise :class:`PlotUnavailable` now (before any model runs) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed: pip install matplotlib") from None


def plot_kld(rep: AccuracyReport, path: str | Path) -> Path:
    """PNG with the per-token KLD distribution of each candidate: CDF and histogram on log axes."""
    require_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), dpi=110)
    cdf, hist = fig.subplots(1, 2)
    logs = [torch.log10(c.kld_values.clamp_min(KLD_FLOOR)) for c in rep.candidates]
    everything = torch.cat(logs)
    bins = torch.linspace(float(everything.min()), float(everything.max()) + 1e-9, 61).numpy()  # shared by all
    for c, lv in zip(rep.candidates, logs):
        v = (10.0 ** lv).sort().values
        y = torch.arange(1, v.numel() + 1, dtype=torch.float64) / v.numel()
        cdf.step(v.numpy(), y.numpy(), where="post", label=f"{c.name} (mean {c.summary.kld_mean:.2e})")
        hist.hist(lv.numpy(), bins=bins, histtype="step", label=c.name)
    cdf.set_xscale("log")
    cdf.set_xlabel("per-token KLD (nats)")
    cdf.set_ylabel("fraction of tokens ≤ x")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(fontsize="small")
    hist.set_xlabel("log10 per-token KLD")
    hist.set_ylabel("tokens")
    hist.grid(True, alpha=0.3)
    fig.suptitle(f"KLD vs {Path(rep.reference).name} ({rep.n_scored} tokens; values < {KLD_FLOOR:g} drawn at {KLD_FLOOR:g})")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out
