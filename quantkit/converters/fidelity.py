"""Per-tensor fidelity, accumulated chunk by chunk: the dequantized output against the dequantized
source, both in float32 and in the source's logical orientation.

  rel_err     = ||out - ref||_2 / ||ref||_2   (0 when both are 0)
  max_abs_err = max |out - ref|
  exact_share = share of elements with out == ref (NaN == NaN counts as equal)

Sums of squares: float32 squares summed in float64 by numpy (one thread, a fixed order) per chunk,
the chunk sums added with math.fsum, so the figures do not depend on the thread or worker count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


def _sumsq(t: torch.Tensor) -> float:
    """sum(t**2) for float32 t: squares in float32, summed in float64 by numpy (pairwise, buffered, one thread);
    on a GPU by torch in float64 (a fixed kernel order for a given shape)."""
    if t.device.type != "cpu":
        return float(t.double().square().sum())
    a = t.detach().reshape(-1).numpy()
    return float(np.sum(np.square(a), dtype=np.float64))


def _num(x: float) -> float | str:
    """JSON-safe, 6 significant digits (non-finite values as strings)."""
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)


@dataclass
class Fidelity:
    numel: int = 0
    exact: int = 0
    max_abs: float = 0.0
    sse: list[float] = field(default_factory=list)
    ssr: list[float] = field(default_factory=list)

    def add(self, ref: torch.Tensor, out: torch.Tensor) -> None:
        ref, out = ref.float().contiguous(), out.float().contiguous()
        d = out - ref  # finite a, b: a - b == 0 exactly when a == b (IEEE, no flush to zero on CPU)
        if not bool(torch.isfinite(d).all()):  # inf - inf, NaN: decide equality elementwise
            eq = (out == ref) | (out.isnan() & ref.isnan())
            d = torch.where(eq, torch.zeros_like(d), d)
        self.numel += ref.numel()
        self.exact += int((d == 0).sum())
        if d.numel():
            lo, hi = torch.aminmax(d)
            self.max_abs = max(self.max_abs, -float(lo), float(hi))
        self.sse.append(_sumsq(d))
        self.ssr.append(_sumsq(ref))

    @classmethod
    def identical(cls, numel: int) -> "Fidelity":
        """A copy: every element equal by construction (nothing read)."""
        return cls(numel=numel, exact=numel)

    def rel_err(self) -> float:
        sse, ssr = math.fsum(self.sse), math.fsum(self.ssr)
        if sse == 0:
            return 0.0
        return math.sqrt(sse / ssr) if ssr > 0 else math.inf

    def record(self, path: str, exact_path: bool) -> dict:
        return {
            "path": path,
            "exact_path": exact_path,
            "rel_err": _num(self.rel_err()),
            "max_abs_err": _num(self.max_abs),
            "exact_share": _num(self.exact / self.numel) if self.numel else 1.0,
            "numel": self.numel,
        }
