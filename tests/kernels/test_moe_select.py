"""The fused MoE's selection (quantkit/kernels/moe/select.py): every choice names a leaf that runs the shape, the
table rows parse, the kernel map, the wgmma rules, each leaf gives the reference's bytes on exact inputs, and the
dispatcher records the leaf.  Budget: under 60 s on 2 cores."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from quantkit.formats import fp8_block, mxfp8
from quantkit.kernels import dispatch
from quantkit.kernels.dispatch import TARGETS, Target
from quantkit.kernels.moe import select as sel
from quantkit.kernels.moe import tables
from quantkit.kernels.moe.fused_moe import LEAVES
from quantkit.kernels.moe.fused_moe_ref import ExpertWeights, MoeSpec, fused_moe_ref
from quantkit.kernels.moe.tables import MoeConfig

from .test_fused_moe import GPT_OSS, experts, leaf, on, routed, run_triton


def test_wgmma_rules(gen):
    """The wgmma leaf: which experts and targets it takes (each refusal names its rule); an explicit config it cannot
    run raises, the table's prefill row falls back to Triton sorted rows."""
    h200, a100 = TARGETS["h200"], Target("cuda", (8, 0), 108, "a100", frozenset())
    wg = MoeConfig(64, 64, 128, num_stages=4, sorted_rows=True, wgmma=True)
    assert sel.wgmma_why_not(h200, "fp8-block", True, 2880, 2880, wg, True) is None
    assert "FP8-block experts only" in sel.wgmma_why_not(h200, "mxfp8", True, 2880, 2880, wg, True)
    assert "64 or 128 rows only" in sel.wgmma_why_not(h200, "fp8-block", True, 2880, 2880, replace(wg, block_m=32), True)
    assert "one scale block" in sel.wgmma_why_not(h200, "fp8-block", False, 160, 96, wg, True)  # concatenated gate/up, I = 96
    assert "sm_90" in sel.wgmma_why_not(a100, "fp8-block", True, 2880, 2880, wg, True)
    assert sel.select(h200, 8192, 32, 4, 2880, 2880, "fp8-block", interleaved=True).kernel == "triton.sorted_wgmma"
    assert sel.select(a100, 8192, 32, 4, 2880, 2880, "fp8-block", interleaved=True).kernel == "triton.sorted"
    with pytest.raises(ValueError, match=r"fused_moe 32x64/128/w4/st4/sorted/wgmma: expert blocks of 64 or 128 rows only"):
        sel.select(h200, 8192, 32, 4, 2880, 2880, "fp8-block", interleaved=True, config=replace(wg, block_m=32))
    w13, w2 = experts("fp8-block", 2, 256, 128, gen, bias=True), experts("fp8-block", 2, 128, 128, gen, bias=True)
    x = torch.randn(40, 128, generator=gen).to(torch.bfloat16)
    w, ids = routed(40, 2, 2, gen)
    with pytest.raises(ValueError, match="wgmma needs compiled sm_90"):
        leaf(x, w, ids, w13, w2, GPT_OSS, wg)


# ---- selection invariants ------------------------------------------------------------------------------------------

SHAPES = [(32, 4, 2880, 2880, True), (128, 8, 2048, 768, False), (256, 8, 7168, 2048, False), (8, 2, 160, 96, False),
          (3, 2, 160, 96, True), (64, 6, 2048, 1408, False), (128, 1, 4096, 256, True)]  # (E, k, H, I, interleaved)
TOKENS = [0, 1, 2, 3, 5, 8, 16, 31, 64, 100, 256, 257, 1000, 1024, 2049, 8192, 16384]
TEST_TARGETS = [TARGETS["h200"], Target("cuda", (8, 0), 108, "a100", frozenset()), Target("cuda", (9, 0), 132, "h100"), Target("cpu")]


def runs(c, target: Target, fmt: str, il: bool, h: int, i: int, dense: bool) -> str | None:
    """Why the chosen leaf cannot run the shape (None: it can)."""
    cfg = c.config
    if sel.fit(cfg, fmt) != cfg or (cfg.pdl and (c.kernel != "triton.moe_steps" or not sel.compiled_sm90(target))):
        return "a config field the format, leaf or target does not take"
    if c.kernel == "triton.sorted_wgmma":
        return sel.wgmma_why_not(target, fmt, il, h, i, cfg, dense)
    if c.kernel == "triton.sorted":
        return sel.sorted_why_not(fmt, il, h, i, cfg, dense) or (None if cfg.sorted_rows and not cfg.wgmma else "flags")
    return None if not cfg.sorted_rows and (cfg.diag or cfg.block_m >= 16) else "gathered rows: 16-row blocks, or diag"


@pytest.mark.parametrize("target", TEST_TARGETS, ids=lambda t: t.name or t.type)
def test_every_choice_names_a_leaf_that_runs_the_shape(target):
    for (e, k, h, i, il), fmt, t, dense in itertools.product(SHAPES, tables.H200, TOKENS, (True, False)):
        c = sel.select(target, t, e, k, h, i, fmt, interleaved=il, dense=dense, backend="triton")
        where = f"{target.name} E{e} k{k} H{h} I{i} {fmt} T{t} dense={dense}: {c} ({c.reason})"
        assert c.kernel in LEAVES and isinstance(c.config, MoeConfig) and c.reason and "\n" not in c.reason, where
        assert runs(c, target, fmt, il, h, i, dense) is None, f"{where}: {runs(c, target, fmt, il, h, i, dense)}"
    assert sel.select(Target("cpu"), 1, 32, 4, 2880, 2880, "mxfp8", interleaved=True).kernel == "torch", "auto never interprets"


def test_table_rows_parse_and_name_runnable_configs():
    """Every row: limits ascending to inf, a one-line reason, fields its format takes; MX block-diagonal rows keep
    their dots on mma.sync (under 64-row tiles or 4 warps: float32 sums)."""
    for kind, table in tables.TABLES.items():
        for fmt, rows in table.items():
            limits = [r.max_pairs for r in rows]
            assert limits == sorted(limits) and limits[-1] == float("inf"), (kind, fmt, limits)
            for r in rows:
                assert r.reason and "\n" not in r.reason and sel.fit(r.config, fmt) == r.config, (kind, fmt, r)
                assert not r.config.diag or r.config.num_warps < 4 or max(r.config.block_n1, r.config.block_n2) < 64, r
    assert sel.sorted_why_not("fp8-block", True, 2880, 2880, tables.PREFILL_TILED, True) is None


def test_kernel_map():
    """48 rows on the H200 (three models, two formats, eight token counts), each a Triton leaf; a CPU target runs the
    reference."""
    rows = [r for r in dispatch.kernel_map(TARGETS["h200"]) if r.op == "fused_moe"]
    assert len(rows) == len(tables.MAP_MODELS) * 2 * len(tables.MAP_TOKENS) == 48
    assert all(r.choice.kernel in LEAVES and r.choice.reason for r in rows)
    assert {r.choice.kernel for r in dispatch.kernel_map(Target("cpu")) if r.op == "fused_moe"} == {"torch"}


# x, weights and biases with few significant bits and power-of-two scales: every product and sum is exact in float32
# whatever the order, so each leaf must give the reference's bytes
def exact_case(fmt: str, spec: MoeSpec, gen: torch.Generator, t: int = 9, e: int = 4, h: int = 256, inter: int = 128):
    def ints(*shape):
        return torch.randint(-8, 9, shape, generator=gen).float()

    def make(n, k, bias):
        q, s = fp8_block.quantize_weight(ints(e, n, k) / 16, "ue8m0") if fmt == "fp8-block" else mxfp8.quantize(ints(e, n, k) / 16)
        return ExpertWeights(fmt, q, s, (ints(e, n) / 4).to(torch.bfloat16) if bias else None)

    w, ids = routed(t, 2, e, gen)
    return (ints(t, h) / 2).to(torch.bfloat16), w, ids, make(2 * inter, h, True), make(h, inter, spec.interleaved)


LEAF_CASES = [("triton.moe_steps", None), ("triton.moe_steps", MoeConfig(16, 32, 32)), ("triton.sorted", MoeConfig(16, 64, 64, sorted_rows=True))]


@pytest.mark.parametrize("fmt", ["fp8-block", "mxfp8"])
@pytest.mark.parametrize("spec", [MoeSpec("gpt-oss", True, scale_fmt="ue8m0"), MoeSpec("silu", scale_fmt="ue8m0")], ids=["gpt-oss", "silu"])
@pytest.mark.parametrize("kernel,cfg", LEAF_CASES, ids=["default", "16x32", "sorted"])
def test_each_leaf_gives_the_references_bytes(triton_device, gen, fmt, spec, kernel, cfg):
    cfg = replace(cfg, upcast=True) if cfg is not None and cfg.sorted_rows and fmt == "mxfp8" else cfg
    x, w, ids, w13, w2 = exact_case(fmt, spec, gen)
    assert leaf(x, w, ids, w13, w2, spec, cfg, triton_device) == kernel
    out, ref = run_triton(x, w, ids, w13, w2, spec, triton_device, cfg).cpu(), fused_moe_ref(x, w, ids, w13, w2, spec)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), f"{kernel}: {int((out != ref).sum())} elements differ"


def test_dispatcher_records_the_leaf(triton_device, gen):
    x, w, ids, w13, w2 = exact_case("mxfp8", GPT_OSS, gen)
    ops = dispatch.Dispatcher(backend="triton")
    ops.call("fused_moe", x.to(triton_device), w.to(triton_device), ids.to(triton_device), on(w13, triton_device), on(w2, triton_device), GPT_OSS)
    assert ops.ran["fused_moe"] == leaf(x, w, ids, w13, w2, GPT_OSS, device=triton_device) == "triton.moe_steps"


