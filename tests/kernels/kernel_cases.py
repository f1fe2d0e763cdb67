"""Inputs and comparisons shared by the kernel tests (CPU interpreter and GPU).

Comparisons are bit for bit.  The only freedom allowed is the bit pattern of a NaN: torch's own
CPU and CUDA paths disagree on NaN payloads and signs (x86 keeps the operand's NaN, NVIDIA
GPUs return the canonical 0x7FFFFFFF), so any NaN matches any NaN -- in float tensors by
``isnan`` and in E4M3 bytes by the two NaN codes 0x7F / 0xFF.
"""

from __future__ import annotations

import torch

E4M3_NAN = (0x7F, 0xFF)


def _bits(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(integer view, NaN mask) of a tensor as stored."""
    if t.dtype in (torch.float8_e4m3fn, torch.uint8):
        b = t.view(torch.uint8).to(torch.int32)
        return b, (b == E4M3_NAN[0]) | (b == E4M3_NAN[1]) if t.dtype == torch.float8_e4m3fn else torch.zeros_like(b, dtype=torch.bool)
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return t.view(ints[t.dtype]).to(torch.int64), t.isnan()


def assert_same(ref: torch.Tensor, out: torch.Tensor, what: str, x: torch.Tensor | None = None) -> None:
    """Bit-exact equality (NaN matches NaN); on failure name the first differing elements."""
    got, want = f"{out.dtype}{tuple(out.shape)}", f"{ref.dtype}{tuple(ref.shape)}"
    assert got == want, f"{what}: got {got}, want {want}"
    rb, rn = _bits(ref.cpu())
    ob, on = _bits(out.cpu())
    bad = (rb != ob) & ~(rn & on)
    if bad.any():
        where = bad.nonzero()[:5].tolist()
        rows = []
        for i in where:
            src = "" if x is None or x.shape != ref.shape else f" x={x.cpu()[tuple(i)].item()!r}"
            rows.append(f"{tuple(i)}: want {rb[tuple(i)].item():#x} got {ob[tuple(i)].item():#x}{src}")
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} elements differ; first: " + "; ".join(rows))


def wide_randn(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """float32 normal values whose magnitude spans 1e-3 .. 1e3 along the last dim."""
    x = torch.randn(shape, generator=gen)
    return x * torch.logspace(-3, 3, shape[-1])


def e4m3_edges() -> torch.Tensor:
    """Every positive E4M3 value, every midpoint between neighbours (ties) and the float32
    neighbours of each midpoint, with both signs: float32 [~2000], all within +-448."""
    vals = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    mids = (vals[:-1] + vals[1:]) / 2
    below = torch.nextafter(mids, torch.zeros_like(mids))
    above = torch.nextafter(mids, torch.full_like(mids, 1e9))
    pos = torch.cat([vals, mids, below, above])
    return torch.cat([pos, -pos])


def scale_one_rows(group: int = 32) -> torch.Tensor:
    """[R, 4 * group] rows whose every ``group`` of elements has amax exactly 448, so every
    scale (float or power of two, either rule, 1x32 / 1x128 / 32x32 tiles) is 1 and the E4M3
    rounding sees the edge values unscaled."""
    edges = e4m3_edges()
    per = group - 1
    n = -(-edges.numel() // per) * per
    vals = torch.cat([edges, edges[: n - edges.numel()]]).reshape(-1, per)
    sign = torch.where(torch.arange(vals.shape[0]) % 2 == 0, 448.0, -448.0)[:, None]
    g = torch.cat([sign, vals], dim=1)  # [groups, group]
    g = torch.cat([g, g[: (-g.shape[0]) % 4]])
    return g.reshape(-1, 4 * group)


def special_groups(group: int = 32) -> torch.Tensor:
    """float32 [16, group] rows, one scale case each: zeros, signed zeros, NaN, +-Inf, float32
    subnormal amax (and a subnormal next to normals), powers of two and their neighbours, the
    rceil/floor boundary (mantissa above 1.75, which floor saturates), DeepSeek's 1e-4 floor."""
    tiny = torch.finfo(torch.float32).tiny
    sub = torch.tensor([tiny / 2**k for k in range(1, 23)], dtype=torch.float32)
    r = torch.linspace(-1, 1, group)
    rows = [
        torch.zeros(group),
        torch.where(r < 0, -0.0, 0.0),
        r.clone().index_fill_(0, torch.tensor([3]), float("nan")),
        r.clone().index_fill_(0, torch.tensor([5]), float("inf")),
        r.clone().index_fill_(0, torch.tensor([7]), float("-inf")),
        torch.cat([sub, -sub]).repeat(group)[:group],
        torch.cat([sub[:4], r[4:] * 2**-120]),
        r * 2**10,
        r * torch.nextafter(torch.tensor(2.0**10), torch.tensor(0.0)),
        -r.abs() * 2**-3 - 2**-3,
        r * 479.0,  # amax mantissa 1.87 > 1.75: floor keeps k, saturates; rceil goes up
        r * 449.0,
        r * 1e-4,
        r * 0.9e-4,
        r * 3e38,
        r * 2.0**-130,
    ]
    return torch.stack([row[:group] for row in rows])
