"""``quantkit eval accuracy``: the reference on the source and the engine on each candidate, over
the same token windows, compared with llama.cpp's --kl-divergence statistics (:mod:`.metrics`).

Two passes, as llama.cpp's base-logits file: the reference runs first over every window and its
scored logits and hidden states go to a temporary directory, one file per window; the reference
is then dropped and each candidate is loaded in turn and compared window by window.  Peak memory
is one model plus one window's reference data, whatever the number of candidates.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..checkpoint import Checkpoint
from ..modelconfig import ModelConfig
from ..modelshapes import verify
from ..progress import Progress
from .data import Windows, make_windows
from .metrics import Accumulator, Summary
from .reference import IMPLS, Runner, open_reference

OpenCandidate = Callable[[str, str, str, bool], Runner]  # (path, device, dtype, act_quant) -> runner


@dataclass
class CandidateResult:
    name: str
    path: str
    runner: str
    summary: Summary
    kld_values: torch.Tensor  # [n_scored] float64, for the plot (not in JSON)
    failures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "runner": self.runner, "passed": not self.failures,
                "failures": self.failures, **self.summary.as_dict()}


@dataclass
class AccuracyReport:
    reference: str
    impl: str
    reference_runner: str
    data: str
    n_windows: int
    ctx: int
    n_scored: int
    candidates: list[CandidateResult]
    gate: dict[str, float | None]
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(not c.failures for c in self.candidates)

    def as_dict(self) -> dict:
        return {
            "reference": self.reference, "impl": self.impl, "reference_runner": self.reference_runner,
            "data": self.data, "n_windows": self.n_windows, "ctx": self.ctx, "n_scored": self.n_scored,
            "gate": self.gate, "passed": self.passed, "seconds": round(self.seconds, 3),
            "candidates": [c.as_dict() for c in self.candidates],
        }


def engine_candidate(path: str, device: str, dtype: str, act_quant: bool) -> Runner:
    from .candidates import EngineRunner

    return EngineRunner(path, device, dtype, act_quant)


# what makes two checkpoints the same model, as quantkit.modelconfig reads it (so a transformers 4.x
# config and a 5.x one of the same model agree whatever keys each writes)
SAME_MODEL = ("family", "vocab", "layers", "hidden", "heads", "kv_heads", "head_dim", "experts")


def check_compatible(reference: str, candidates: Sequence[str]) -> ModelConfig:
    """The reference's config, each checkpoint's checked against its tensors; an error naming the
    candidate whose family, vocabulary, depth or widths differ."""
    ref = verify(Checkpoint(reference))
    for c in candidates:
        mc = verify(Checkpoint(c))
        diff = [f"{k} {getattr(mc, k)!r} vs {getattr(ref, k)!r}" for k in SAME_MODEL if getattr(mc, k) != getattr(ref, k)]
        if diff:
            raise ValueError(f"candidate {c} is not the reference's model: {'; '.join(diff)}")
    return ref


def gate_failures(s: Summary, max_kld: float | None, min_top1: float | None) -> list[str]:
    out = []
    if max_kld is not None and not s.kld_mean <= max_kld:
        out.append(f"mean KLD {s.kld_mean:.6g} > --max-kld {max_kld:g}")
    if min_top1 is not None and not s.top1_pct >= min_top1:
        out.append(f"same top-1 {s.top1_pct:.3f}% < --min-top1 {min_top1:g}%")
    return out


def _names(paths: Sequence[str]) -> list[str]:
    short = [Path(p).name or str(p) for p in paths]
    return short if len(set(short)) == len(short) else [str(p) for p in paths]


def _progress(total: int, style: str) -> Progress:
    return Progress("eval accuracy", total, "window", style)


def _run_reference(runner: Runner, win: Windows, tmp: Path, hidden: bool, bar) -> None:
    for w in range(win.tokens.shape[0]):
        f = runner.forward(win.tokens[w])
        rows, _ = win.scored(w)
        torch.save({"logits": f.logits[rows].cpu(), "hidden": [h.cpu() for h in f.hidden] if hidden else []}, tmp / f"{w}.pt")
        bar.update(1)


def _run_candidate(runner: Runner, win: Windows, tmp: Path, hidden: bool, bar) -> Accumulator:
    acc = Accumulator()
    for w in range(win.tokens.shape[0]):
        ref = torch.load(tmp / f"{w}.pt", weights_only=True)
        f = runner.forward(win.tokens[w])
        rows, targets = win.scored(w)
        acc.add_logits(ref["logits"].to(f.logits.device), f.logits[rows], targets)
        if hidden:
            acc.add_hidden(ref["hidden"], [h.cpu() for h in f.hidden])
        bar.update(1)
    return acc


def evaluate(
    candidates: Sequence[str],
    reference: str,
    impl: str = "transformers",
    data: str | None = None,
    tokens: int = 4096,
    ctx: int = 512,
    device: str = "cpu",
    dtype: str = "float32",
    act_quant: bool = True,
    seed: int = 0,
    hidden: bool = True,
    max_kld: float | None = None,
    min_top1: float | None = None,
    progress: str = "off",
    open_candidate: OpenCandidate = engine_candidate,
) -> AccuracyReport:
    """Compare each candidate with the reference; see the module docstring for the passes."""
    if not candidates:
        raise ValueError("give at least one candidate checkpoint")
    if impl not in IMPLS:
        raise ValueError(f"--impl {impl!r}: choose one of {', '.join(IMPLS)}")
    t0 = time.perf_counter()
    cfg = check_compatible(reference, candidates)
    win = make_windows(reference, data, tokens, ctx, cfg.vocab, seed)
    n_win = win.tokens.shape[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="quantkit-eval-") as d, _progress((1 + len(candidates)) * n_win, progress) as bar:
        tmp = Path(d)
        # --impl engine: float32 and unquantized activations, the source's own numerics, as transformers runs it
        runner = open_reference(impl, reference, device) if impl != "engine" else open_candidate(reference, device, "float32", False)
        ref_label = runner.label
        _run_reference(runner, win, tmp, hidden, bar)
        del runner  # free the reference model before a candidate loads
        for name, path in zip(_names(candidates), candidates):
            runner = open_candidate(path, device, dtype, act_quant)
            acc = _run_candidate(runner, win, tmp, hidden, bar)
            s = acc.summary()
            results.append(CandidateResult(name, str(path), runner.label, s, acc.kld_values(), gate_failures(s, max_kld, min_top1)))
            del runner
    return AccuracyReport(
        reference=str(reference), impl=impl, reference_runner=ref_label, data=win.source, n_windows=n_win,
        ctx=win.ctx, n_scored=win.n_scored, candidates=results, gate={"max_kld": max_kld, "min_top1": min_top1},
        seconds=time.perf_counter() - t0,
    )
