"""The GEMM selection (quantkit/kernels/gemm/select.py): invariants, not table rows.

On a grid of shapes, for the H200 target and this CPU, every choice names a leaf that can run the shape; explicit
backends restrict the leaves; every table row parses and names a leaf; the leaf the selection runs in Triton's CPU
interpreter gives the reference's bytes (exact inputs: small integers times powers of two, so every float32 sum is
exact whatever its order).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from quantkit.kernels import dispatch
from quantkit.kernels.dispatch import SM90_SMEM
from quantkit.kernels.gemm import deepgemm, select, tables, wgmma
from quantkit.kernels.gemm.block_scaled import INT32_LIMIT, Config
from quantkit.kernels.gemm.gemm_ref import gemm_fp8_block_ref, gemm_mxfp8_ref
from quantkit.kernels.gemm.skinny import SkinnyConfig

H200 = dispatch.TARGETS["h200"]
CPU = select.device_target(torch.device("cpu"))
ROWS = {"triton.skinny": SkinnyConfig, "triton.tiled": Config, "triton.wgmma": wgmma.WgmmaConfig, "deepgemm": type(None),
        "dequant-bf16": type(None)}  # fmt: skip  # a table row's config, per leaf
LEAVES = ROWS | {"deepgemm": deepgemm.Config}  # a choice's: DeepGEMM's compiled config
MS = (0, 1, 2, 7, 16, 24, 25, 31, 32, 33, 48, 63, 64, 65, 100, 128, 200, 256, 257, 512, 513, 1000, 4096, 8192)
NS = (8, 72, 136, 2112, 2116, 2880, 4096, 7168, 24576)
KS = (32, 128, 200, 512, 1024, 2048, 2880, 2888, 4096, 4112, 7168, 16384)
OUT = (torch.bfloat16, torch.float32)


def assert_runs(t: dispatch.Target, c: dispatch.Choice, op: str, m: int, n: int, k: int, out: torch.dtype, backend: str) -> None:
    """The leaf can run this call on t, with the launch the selection gives it."""
    what = f"{op} {backend} M={m} N={n} K={k} {out} on {t.name}: {c}"
    assert isinstance(c.config, LEAVES[c.kernel]) and c.reason, what
    if c.kernel == "deepgemm":
        assert op == "gemm_fp8_block" and select.has(t, "deepgemm"), what
        assert backend == "deepgemm" or (n % 8 == 0 and k % 16 == 0 and out == torch.bfloat16), what
        assert c.config == deepgemm.config_for(m, n, k, t.sms) and c.config.smem <= SM90_SMEM and c.config.stages >= 4, what
    elif c.kernel == "triton.wgmma":
        cfg = c.config
        assert op == "gemm_fp8_block" and select.has(t, "wgmma") and k % 16 == 0 and m * n < INT32_LIMIT, what
        assert out in wgmma.OUT_DTYPES and cfg.block_n in wgmma.BLOCK_NS and cfg.split_k >= 1, what
        assert wgmma.splits(m, n, k, cfg, t.sms)[0] == cfg.split_k, f"{what}: every K run is non-empty"
        assert 2 * 64 * cfg.block_n * out.itemsize + cfg.stages * (128 + cfg.block_n) * 128 + 1024 <= SM90_SMEM, f"{what}: the ring fits"
    elif c.kernel == "triton.skinny":
        assert op == "gemm_mxfp8" or 128 % c.config.block_n == 0, f"{what}: BLOCK_N divides the 128-row weight scale tiles"
    elif c.kernel == "triton.tiled":
        assert not c.config.tma or k % 16 == 0, f"{what}: TMA needs 16-byte rows"
    else:
        assert op == "gemm_mxfp8" and k % 32 == 0, what


@pytest.mark.parametrize("op", ["gemm_fp8_block", "gemm_mxfp8"])
def test_every_choice_runs_its_shape_and_explicit_backends_restrict(op):
    sel, alt = (select.select_fp8_block, "deepgemm") if op == "gemm_fp8_block" else (select.select_mxfp8, "dequant-bf16")
    ks = KS if op == "gemm_fp8_block" else [k for k in KS if k % 32 == 0]
    seen = set()
    for m, n, k, out in itertools.product(MS, NS, ks, OUT):
        auto, tri, only = (sel(H200, m, n, k, out, b) for b in ("auto", "triton", alt))
        for b, c in (("auto", auto), ("triton", tri), (alt, only)):
            assert_runs(H200, c, op, m, n, k, out, b)
        assert tri.kernel.startswith("triton.") and only.kernel == alt, "an explicit backend runs its own leaves only"
        assert (auto.kernel, auto.config) == (tri.kernel, tri.config) or not auto.kernel.startswith("triton."), "auto adds leaves, nothing else"
        cpu = sel(CPU, m, n, k, out, "triton")
        assert_runs(CPU, cpu, op, m, n, k, out, "triton")
        assert cpu.kernel in ("triton.skinny", "triton.tiled"), "no wgmma or DeepGEMM without sm_90"
        seen |= {auto.kernel, tri.kernel}
    assert seen == ({"triton.skinny", "triton.wgmma", "triton.tiled", "deepgemm"} if op == "gemm_fp8_block" else
                    {"triton.skinny", "triton.tiled", "dequant-bf16"}), "the grid reaches every leaf"  # fmt: skip


def test_unaligned_rows_never_reach_tma():
    for m, n in itertools.product((1, 64, 65, 200, 600, 4096), (136, 2112)):
        for c in (select.select_fp8_block(H200, m, n, 2048, aligned=False), select.select_mxfp8(H200, m, n, 2048, backend="triton", aligned=False)):
            assert c.kernel != "triton.wgmma" and not (isinstance(c.config, Config) and c.config.tma), c


TABLES = [(f"{op} {kind}", t) for op, by in (("fp8", tables.FP8_BLOCK), ("mx", tables.MXFP8)) for kind, t in by.items()]


@pytest.mark.parametrize("name,table", TABLES)
def test_table_rows_parse_and_end_with_rows_every_device_runs(name, table):
    for row in table:
        assert isinstance(row.config, ROWS[row.kernel]) and row.reason and 0 <= row.k_min <= row.k_max, (name, row)
    last = [r for r in table if r.kernel in ("triton.skinny", "triton.tiled")]
    assert last[-1].m_max >= INT32_LIMIT and last[-1].k_min == 0 and last[-1].k_max >= INT32_LIMIT, f"{name}: a Triton row holds every shape"


def test_map_rows_for_the_h200_and_the_cpu():
    rows = [r for r in dispatch.kernel_map(H200) if r.op in ("gemm_fp8_block", "gemm_mxfp8")]
    assert len(rows) == 2 * len(select.MAP_SHAPES) * len(select.MAP_MS)
    assert all(r.choice.kernel in LEAVES and r.choice.reason for r in rows)
    cpu = [r for r in dispatch.kernel_map(dispatch.target("cpu")) if r.op in ("gemm_fp8_block", "gemm_mxfp8")]
    assert cpu and all(r.choice.kernel == "torch" for r in cpu)


@pytest.mark.parametrize("present", [True, False])
def test_a_bare_device_target_maps_the_kernels_its_device_has(monkeypatch, present):
    """``quantkit kernels --device cuda`` maps a bare Target (optional None): DeepGEMM and wgmma are asked of the device,
    so with both present its map is the named H200's, and with neither no row names them."""
    monkeypatch.setattr(select.deepgemm, "available_cached", lambda device: dispatch.Availability(present))
    monkeypatch.setattr(select, "_wgmma_ok", lambda device: present)
    bare = dispatch.Target("cuda", H200.capability, H200.sms, f"bare H200, optional kernels {present}")  # own name: own cache
    rows = [(r.op, r.case, r.m, r.choice.kernel, r.choice.config) for r in dispatch.kernel_map(bare) if r.op.startswith("gemm_")]
    named = [(r.op, r.case, r.m, r.choice.kernel, r.choice.config) for r in dispatch.kernel_map(H200) if r.op.startswith("gemm_")]
    if present:
        assert rows == named
    else:
        kernels = {r[3] for r in rows}
        assert "deepgemm" not in kernels and "triton.wgmma" not in kernels and {"deepgemm", "triton.wgmma"} <= {r[3] for r in named}


# ---- the selected leaf in the CPU interpreter: the reference's bytes ---------------------------------------------------


def exact_case(fmt: str, m: int, n: int, k: int, gen: torch.Generator, device) -> tuple:
    """Small-integer E4M3 operands with power-of-two scales: every product and float32 sum is exact."""
    a = torch.randint(-3, 4, (m, k), generator=gen).float().to(torch.float8_e4m3fn)
    w = torch.randint(-3, 4, (n, k), generator=gen).float().to(torch.float8_e4m3fn)
    if fmt == "fp8-block":
        sa = 2.0 ** torch.randint(-3, 4, (m, -(-k // 128)), generator=gen).float()
        sw = 2.0 ** torch.randint(-3, 4, (-(-n // 128), -(-k // 128)), generator=gen).float()
    else:
        sa = (127 + torch.randint(-3, 4, (m, k // 32), generator=gen)).to(torch.uint8)
        sw = (127 + torch.randint(-3, 4, (n, k // 32), generator=gen)).to(torch.uint8)
    b = torch.randint(-8, 9, (n,), generator=gen).to(torch.bfloat16)
    return tuple(t.to(device) for t in (a, sa, w, sw, b))


CASES = [  # (format, M, N, K): M = 1, K % 128 != 0, partial tiles, rows TMA cannot read, the large-M tiles
    ("fp8-block", 1, 200, 300), ("fp8-block", 40, 136, 256), ("fp8-block", 70, 136, 200), ("fp8-block", 520, 64, 256),
    ("fp8-block", 520, 40, 200), ("mxfp8", 3, 80, 224), ("mxfp8", 40, 72, 256), ("mxfp8", 70, 80, 224), ("mxfp8", 520, 64, 256),
]  # fmt: skip


@pytest.mark.parametrize("fmt,m,n,k", CASES)
def test_selected_leaf_gives_the_reference_bytes(triton_device, gen, fmt, m, n, k):
    op, ref_fn = ("gemm_fp8_block", gemm_fp8_block_ref) if fmt == "fp8-block" else ("gemm_mxfp8", gemm_mxfp8_ref)
    a, sa, w, sw, b = exact_case(fmt, m, n, k, gen, triton_device)
    ref = ref_fn(a.cpu(), sa.cpu(), w.cpu(), sw.cpu(), b.cpu(), torch.float32)
    backends = ("triton",) if fmt == "fp8-block" else ("triton", "dequant-bf16")
    for backend in backends:
        c = dispatch.choose(op, a, sa, w, sw, b, torch.float32, backend=backend)
        t = select.device_target(a.device)
        sel = select.select_fp8_block if fmt == "fp8-block" else select.select_mxfp8
        assert c == sel(t, m, n, k, torch.float32, backend, aligned=k % 16 == 0), "the adapter asks the selection"
        ops = dispatch.Dispatcher(backend=backend)
        out = ops.call(op, a, sa, w, sw, b, torch.float32)
        assert ops.ran[op] == c.kernel, "Dispatcher.ran names the leaf"
        assert torch.equal(out.cpu(), ref), f"{op} {c} M={m} N={n} K={k}: {(out.cpu() - ref).abs().max().item()} off the reference"


def test_cases_cover_every_leaf_the_cpu_runs(triton_device):
    if triton_device.type != "cpu":
        pytest.skip("the CPU's leaves")
    leaves = {(fmt, select.select_fp8_block(CPU, m, n, k, torch.float32, "triton").kernel if fmt == "fp8-block" else
               select.select_mxfp8(CPU, m, n, k, torch.float32, "triton").kernel) for fmt, m, n, k in CASES}  # fmt: skip
    assert leaves == {(f, leaf) for f in ("fp8-block", "mxfp8") for leaf in ("triton.skinny", "triton.tiled")}


def test_leading_dims_choose_as_their_rows(gen):
    a, sa, w, sw, b = exact_case("fp8-block", 6, 136, 256, gen, "cpu")
    c = dispatch.choose("gemm_fp8_block", a, sa, w, sw, backend="triton")
    assert dispatch.choose("gemm_fp8_block", a.reshape(2, 3, 256), sa.reshape(2, 3, 2), w, sw, backend="triton") == c


def test_a_config_is_for_triton_only(gen):
    a, sa, w, sw, _ = exact_case("fp8-block", 2, 136, 256, gen, "cpu")
    with pytest.raises(ValueError, match="launch config is for the Triton kernels"):
        select.choose_fp8_block(a, sa, w, sw, config=SkinnyConfig(), backend="deepgemm")
