"""The config sweep's candidate launches of the GEMM family (``quantkit bench kernels --sweep``), per M."""

from __future__ import annotations


def skinny_candidates(m: int) -> list:
    """Small-M (decode) launches: tile height, programs per SM, pipeline depth, tensor vs CUDA cores."""
    from quantkit.kernels.gemm.block_scaled import Config
    from quantkit.kernels.gemm.skinny import SkinnyConfig as S

    c = [S(64), S(64, waves=2), S(64, waves=8, min_kb=1), S(64, split_k=1), S(32), S(128), S(128, num_warps=8),
         S(64, num_stages=2), S(64, num_stages=6), S(32, waves=8, num_stages=6),
         S(128, num_warps=8, num_stages=6), S(128, num_warps=8, waves=8), S(256, num_warps=8, num_stages=3), S(64, num_stages=8),
         S(32, num_warps=2, waves=8, num_stages=6)]  # fmt: skip
    if m == 1:
        c += [S(64, dot=False, block_m=1), S(32, dot=False, block_m=1), S(128, dot=False, block_m=1, chunk=64, num_warps=8)]
    elif m <= 16:
        c += [S(32, dot=False, chunk=16)]
    c.append(Config(max(16, 1 << (m - 1).bit_length()), 64, swap_ab=True, split_k=0, num_warps=4, num_stages=4))  # first run's table
    return c


def tiled_candidates(m: int) -> list:
    """Large-M launches (vLLM / Triton tutorial space): 64x128 or 128x128, stages, TMA, group size."""
    from quantkit.kernels.gemm.block_scaled import Config as C
    from quantkit.kernels.gemm.skinny import SkinnyConfig

    c = [C(64, 128, num_stages=4), C(64, 128, num_stages=3), C(64, 128, tma=True, num_stages=3), C(64, 128, tma=True, num_stages=4),
         C(64, 128, tma=True, num_stages=5), C(128, 128, tma=True, num_warps=8, num_stages=3), C(128, 128, tma=True, num_warps=8, num_stages=4),
         C(128, 128, num_warps=8, num_stages=3), C(128, 64, tma=True, num_stages=4), C(64, 64, tma=True, num_stages=4),
         C(64, 128, tma=True, group=16, num_stages=3), C(64, 128, tma=True, group=4, num_stages=3)]  # fmt: skip
    if m <= 256:
        c += [C(64, 128, split_k=0, num_stages=4), C(64, 128, split_k=0, tma=True, num_stages=3), SkinnyConfig(64), SkinnyConfig(128, num_warps=8)]
    return c


def persistent_candidates(m: int) -> list:
    """Persistent programs (tl.range flatten): compiled last, a new loop structure for this kernel."""
    from quantkit.kernels.gemm.block_scaled import Config as C

    return [C(64, 128, tma=True, persistent=2, num_stages=3), C(128, 128, tma=True, persistent=1, num_warps=8, num_stages=3)]


def mx_candidates(m: int) -> list[tuple[str, object]]:
    """(path, config) for the MXFP8 sweep."""
    from quantkit.kernels.gemm.block_scaled import Config as C
    from quantkit.kernels.gemm.skinny import SkinnyConfig as S

    if m <= 64:
        return [(p, c) for p in ("mx",) for c in (S(64), S(64, upcast=True), S(64, waves=1, upcast=True), S(128, num_warps=8, waves=2, upcast=True),
                                                         S(128, num_warps=8), S(64, waves=8, min_kb=1))]  # fmt: skip
    return [("mx", C(64, 128, upcast=True, tma=True)), ("mx", C(128, 128, upcast=True, tma=True, num_warps=8)), ("mx", C(64, 128, upcast=True, num_stages=4)),
            ("mx", C(64, 128, tma=True))]  # fmt: skip
