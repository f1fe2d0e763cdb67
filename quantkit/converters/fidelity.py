"""Per-tensor fidelity, accumulated chunk by chunk: the dequantized output against the dequantized
source, both in float32 and in the source's logical orientation.

  rel_err     = ||out - ref||_2 / ||ref||_2   (0 when both are 0)
  max_abs_err = max |out - ref|
  exact_share = share of elements with out == ref (NaN == NaN counts as equal)

Sums of squares: float32 squares summed in float64 by numpy (one thread, a fixed order) per chunk,
the chunk sums added with math.fsum, so the figures do not depend on the thread or worker count.
numpy's ``np.sum(sq, dtype=np.float64)`` of a float32 array is its buffered reduction (the array
cast to float64 a buffer at a time, each buffer summed pairwise): one order for a given length,
unlike BLAS dot products or torch's multi-threaded reductions.  On a CPU the difference, then its
squares, then the reference's squares go into one buffer kept from chunk to chunk (with the
equality mask, :class:`lut.Scratch`): fresh temporaries cost page faults, and every extra
megabyte of working set costs cache misses in the passes around it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..formats.lut import Scratch


def _sumsq(t: torch.Tensor, sq: np.ndarray | None = None) -> float | torch.Tensor:
    """sum(t**2) for float32 t: squares in float32 (into ``sq`` when given, which may be t's own
    memory), summed in float64 by numpy (pairwise, buffered, one thread); on a GPU by torch in
    float64 (a fixed kernel order for a given shape), left on the device (no sync)."""
    if t.device.type != "cpu":
        return t.double().square().sum()
    a = t.detach().reshape(-1).numpy()
    return float(np.sum(np.square(a, out=sq), dtype=np.float64))


def _finite(*xs: torch.Tensor) -> bool:
    return all(math.isfinite(float(x)) for x in xs)


def _num(x: float) -> float | str:
    """JSON-safe, 6 significant digits (non-finite values as strings)."""
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)


def _equal(ref: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return (out == ref) | (out.isnan() & ref.isnan())


@dataclass
class Fidelity:
    numel: int = 0
    exact: int | torch.Tensor = 0  # 0-d device tensors while accumulating on a GPU
    max_abs: float | torch.Tensor = 0.0
    sse: list = field(default_factory=list)
    ssr: list = field(default_factory=list)
    scratch: Scratch = field(default_factory=Scratch, repr=False, compare=False)  # CPU buffers

    def add(self, ref: torch.Tensor, out: torch.Tensor) -> None:
        ref, out = ref.float().contiguous(), out.float().contiguous()
        self.numel += ref.numel()
        if not ref.numel():
            return
        if ref.device.type != "cpu":
            self._add_device(ref, out)
            return
        work = self.scratch.get("f32", ref.shape, torch.float32)
        # finite a, b: a - b == 0 exactly when a == b (IEEE, no flush to zero on CPU)
        d = torch.sub(out, ref, out=work)
        lo, hi = torch.aminmax(d)  # NaN propagates: both finite <=> every difference is finite
        if not _finite(lo, hi):  # inf - inf, NaN: decide equality elementwise
            d = torch.where(_equal(ref, out), torch.zeros_like(d), d)
            lo, hi = torch.aminmax(d)
        is_zero = self.scratch.get("is_zero", (ref.numel(),), torch.bool).numpy()
        # numpy: vectorised, unlike torch.count_nonzero on CPU
        self.exact += int(np.count_nonzero(np.equal(d.reshape(-1).numpy(), 0, out=is_zero)))
        self.max_abs = max(self.max_abs, -float(lo), float(hi))
        sq = work.reshape(-1).numpy()  # d's squares in place, then ref's: the same float32 squares
        self.sse.append(_sumsq(d, sq))
        self.ssr.append(_sumsq(ref, sq))

    def _add_device(self, ref: torch.Tensor, out: torch.Tensor) -> None:
        """The same figures as 0-d device tensors: nothing waits for the device until :meth:`record`."""
        d = torch.where(_equal(ref, out), torch.zeros_like(ref), out - ref)
        self.exact += d.numel() - torch.count_nonzero(d)
        m = d.abs().amax()
        self.max_abs = torch.maximum(m, torch.as_tensor(self.max_abs, device=m.device)) if isinstance(self.max_abs, float) else torch.maximum(self.max_abs, m)
        self.sse.append(_sumsq(d))
        self.ssr.append(_sumsq(ref))

    def settle(self) -> None:
        """Device figures -> Python numbers (one sync per tensor)."""
        self.exact = int(self.exact)
        self.max_abs = float(self.max_abs)
        self.sse = [float(x) for x in self.sse]
        self.ssr = [float(x) for x in self.ssr]

    @classmethod
    def identical(cls, numel: int) -> "Fidelity":
        """A copy: every element equal by construction (nothing read)."""
        return cls(numel=numel, exact=numel)

    def rel_err(self) -> float:
        self.settle()
        sse, ssr = math.fsum(self.sse), math.fsum(self.ssr)
        if sse == 0:
            return 0.0
        return math.sqrt(sse / ssr) if ssr > 0 else math.inf

    def record(self, path: str, exact_path: bool) -> dict:
        self.settle()
        return {
            "path": path,
            "exact_path": exact_path,
            "rel_err": _num(self.rel_err()),
            "max_abs_err": _num(self.max_abs),
            "exact_share": _num(self.exact / self.numel) if self.numel else 1.0,
            "numel": self.numel,
        }
