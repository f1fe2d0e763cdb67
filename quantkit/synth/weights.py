"""Random values for synthetic checkpoints: deterministic by seed, generated in row chunks.

Every value comes from a torch CPU generator seeded by sha256 of (seed, tensor name, part), so a
tensor's bytes depend only on the seed, its HF root name and its shape: not on the order tensors
are written, the shard size, or the layout it is written in (GPT-OSS ``original/`` reuses the root
names' streams).

A linear weight W [out, in] (one expert's, for stacked experts) is

    W[r, c] = std * row[r] * col[c] * z[r, c]      z ~ N(0, 1)
    row, col ~ exp(0.5 * N(0, 1))                   (log-normal per-channel factors)

so output channels, 128x128 tiles and 1x32 MX blocks all get different amax (scale spread), plus
``2 + numel / 2**17`` outliers per chunk of magnitude 8..16 x their local std (the values that
set block scales in real checkpoints).  Norm weights are exp(0.25 * N(0, 1)) (positive, never
constant); biases, sinks and routing biases are small normals.  No tensor is zero or constant.

Row chunks (~4M elements, whole 128-row tiles, fixed by the shape) each own a generator and run
on torch's thread count; the bytes do not depend on how many threads ran them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch

SPREAD = 0.5  # sigma of the log-normal row / column factors
NORM_SPREAD = 0.25
OUTLIER_EVERY = 1 << 17
OUTLIER_GAIN = (8.0, 16.0)
CHUNK_ELEMS = 1 << 22  # ~16 MB of float32 per generated chunk (one per worker thread in flight)
TILE = 128  # chunks hold whole 128-row tiles, so FP8 block scales are chunk-independent

Emit = Callable[[int, torch.Tensor], None]


def seed_of(seed: int, *key: object) -> int:
    """63-bit generator seed from (seed, *key); stable across processes and platforms."""
    digest = hashlib.sha256(repr((int(seed), *key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, *key: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(seed, *key))


def row_chunks(rows: int, cols: int) -> list[tuple[int, int]]:
    """Fixed [r0, r1) row ranges of about CHUNK_ELEMS elements, each a multiple of 128 rows but the last."""
    step = max(TILE, (CHUNK_ELEMS // max(cols, 1)) // TILE * TILE)
    return [(r0, min(r0 + step, rows)) for r0 in range(0, rows, step)]


def lognormal(g: torch.Generator, n: int, sigma: float) -> torch.Tensor:
    """float32 [n] of exp(sigma * N(0, 1))."""
    return torch.randn(n, generator=g).mul_(sigma).exp_()


def _outliers(z: torch.Tensor, row: torch.Tensor, col: torch.Tensor, g: torch.Generator) -> None:
    """Set a few elements of z [r, c] to +-(8..16) x their std row[r] * col[c], in place."""
    n, cols = z.numel(), z.shape[1]
    k = 2 + n // OUTLIER_EVERY
    idx = torch.unique(torch.randint(0, n, (k,), generator=g))  # sorted, no repeats: deterministic writes
    k = idx.numel()
    lo, hi = OUTLIER_GAIN
    gain = torch.rand(k, generator=g) * (hi - lo) + lo
    sign = torch.randint(0, 2, (k,), generator=g).to(torch.float32) * 2 - 1
    z.view(-1)[idx] = sign * gain * row[idx // cols] * col[idx % cols]


def run(jobs: list[Callable[[], None]]) -> None:
    """Run independent chunk jobs, on as many threads as torch uses (torch ops release the GIL)."""
    workers = min(len(jobs), torch.get_num_threads())
    if workers <= 1:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for f in [pool.submit(job) for job in jobs]:
            f.result()


def linear(seed: int, name: str, rows: int, cols: int, std: float, emit: Emit) -> list[Callable[[], None]]:
    """Jobs that each generate one row chunk of a random linear weight [rows, cols] and pass it,
    as (r0, float32 [r1 - r0, cols]), to ``emit`` (which must write disjoint outputs: jobs run in parallel)."""
    g = generator(seed, name)
    row = lognormal(g, rows, SPREAD).mul_(std)
    col = lognormal(g, cols, SPREAD)

    def job(i: int, r0: int, r1: int) -> None:
        z = torch.randn(r1 - r0, cols, generator=generator(seed, name, i))
        z.mul_(col).mul_(row[r0:r1, None])
        _outliers(z, row[r0:r1], col, generator(seed, name, i, "outliers"))
        emit(r0, z)

    return [partial(job, i, r0, r1) for i, (r0, r1) in enumerate(row_chunks(rows, cols))]


def linear_full(seed: int, name: str, rows: int, cols: int, std: float) -> torch.Tensor:
    """The whole float32 [rows, cols] weight (for small tensors and tests)."""
    out = torch.empty(rows, cols)

    def put(r0: int, z: torch.Tensor) -> None:
        out[r0 : r0 + z.shape[0]] = z

    run(linear(seed, name, rows, cols, std, put))
    return out


def norm(seed: int, name: str, n: int) -> torch.Tensor:
    """float32 [n] RMSNorm weight: positive, around 1, never constant."""
    return lognormal(generator(seed, name), n, NORM_SPREAD)


def normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
    """float32 tensor of N(0, std^2) values (biases, sinks, routing biases)."""
    return torch.randn(shape, generator=generator(seed, name)).mul_(std)
