"""The one timer of the benchmarks: eager, CUDA graph with L2 flush, host launch time, and the wall clock of
``--device cpu`` runs.

* :meth:`Timer.eager_ms`: on CUDA ``triton.testing.do_bench``'s median (L2 flushed by its 256 MB memset before
  every call; a host launch slower than that memset shows up as GPU idle time); on the CPU the median wall time
  of up to three calls within ``rep_ms`` (at least one: a smoke run under Triton's interpreter);
* :meth:`Timer.graph_ms`: the call captured in a CUDA graph, each call after an L2 flush that reads
  :data:`FLUSH_BYTES` (:func:`read_flush`), replayed and timed with CUDA events, minus a flush-only graph of the
  same length: what a call costs inside a decode step served from CUDA graphs;
* :meth:`Timer.host_us`: Python time per call of the launches alone;
* :meth:`Timer.events_ms`: CUDA events around one call (what the graph timer reads its replays with).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

FLUSH_BYTES = 256 * 2**20  # as triton.testing.do_bench: several times the 50 MB L2
# The graph timer's flush READS its buffer (an amax): the L2 is left holding clean lines.  do_bench's flush is a memset,
# which leaves the L2 full of dirty lines that the next kernel's reads must write back: on the H200 that charged a plain
# read of a 36 MB weight 14.4 us instead of 11.0 (55% of HBM instead of 71%, ninth pass), a tax that falls hardest on the
# smallest memory-bound kernels.  In a decode step the kernel before a GEMM has mostly read weights, so clean lines are
# the serving case.
CPU_CALLS = 3  # the wall clock's most calls per figure


def read_flush(torch, device) -> Callable[[], object]:
    """The timers' L2 flush: a call reads FLUSH_BYTES (an amax into a scalar), leaving the L2 clean (see FLUSH_BYTES)."""
    buf = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    sink = torch.zeros((), dtype=torch.float32, device=device)
    return lambda: torch.amax(buf, out=sink)


@dataclass
class Timer:
    """Times calls on one device; ``hbm_gbs`` sizes the graph timer's call count (the flush's own time)."""

    torch: object
    device: object
    warmup_ms: int = 10
    rep_ms: int = 30
    hbm_gbs: float = 4800.0
    _flush: Callable[[], object] | None = None
    _flush_graphs: dict = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def eager_ms(self, fn: Callable[[], object]) -> float:
        """Median time of ``fn`` in ms: triton's do_bench (L2 flushed) on CUDA, the wall clock elsewhere."""
        if self.cuda:
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        return self.wall_ms(fn)

    def wall_ms(self, fn: Callable[[], object]) -> float:
        """Median wall time in ms of up to CPU_CALLS calls, stopping once ``rep_ms`` has passed (at least one call)."""
        times: list[float] = []
        while not times or (len(times) < CPU_CALLS and sum(times) < self.rep_ms * 1e-3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    def host_us(self, fn: Callable[[], object], calls: int = 20) -> float:
        """Python time per call, launches only (the GPU catches up after the clock stops)."""
        calls = calls if self.cuda else 2
        if self.cuda:
            self.torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t
        if self.cuda:
            self.torch.cuda.synchronize()
        return dt / calls * 1e6

    def events_ms(self, fn: Callable[[], object]) -> float:
        """ms of one call between two CUDA events on the current stream."""
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def graph_ms(self, fn: Callable[[], object], est_ms: float | None = None) -> float | None:
        """ms per call replayed from a CUDA graph, each call after an L2 flush; None below noise."""
        torch = self.torch
        if self._flush is None:
            self._flush = read_flush(torch, self.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs recommends
            fn()
        torch.cuda.current_stream().wait_stream(side)
        if est_ms is None:  # rough, L2 warm: only sizes the number of captured calls
            est_ms = self.events_ms(lambda: [fn() for _ in range(3)]) / 3
        flush_ms = FLUSH_BYTES / (self.hbm_gbs * 1e6)
        reps = max(2, min(20, int(4.0 / (est_ms + flush_ms))))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                self.l2_flush()
                fn()
        base = self._flush_graph(reps)
        diffs = [(self.events_ms(graph.replay) - self.events_ms(base.replay)) / reps for _ in range(5)]
        del graph
        ms = statistics.median(diffs)
        return ms if ms > 0 else None

    def l2_flush(self) -> None:
        """Evict the L2 by reading FLUSH_BYTES (:func:`read_flush`)."""
        self._flush()

    def _flush_graph(self, reps: int):
        if reps not in self._flush_graphs:
            g = self.torch.cuda.CUDAGraph()
            with self.torch.cuda.graph(g):
                for _ in range(reps):
                    self.l2_flush()
            self._flush_graphs[reps] = g
        return self._flush_graphs[reps]
