"""The attention ops' selection (quantkit/kernels/attention/select.py): every choice names a leaf that runs the
shape, every table row is reached, the kernel maps, the H200-selected leaves give the reference's bytes in the
interpreter, and the dispatcher reports the leaf.  Budget: under 60 s on 2 cores."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from quantkit.kernels import dispatch
from quantkit.kernels.attention import attention_ref as ref_ops, select

from .test_attention import TOL, assert_close, cu, f32, paged_cache, ragged, tol, triton


# ---- the selection: every choice names a leaf that runs the shape -------------------------------

TARGETS = {"h200": dispatch.TARGETS["h200"], "cpu": dispatch.Target("cpu", name="cpu")}


def shapes():
    """Decode / prefill calls of the three models' heads and a small one, at batch sizes and contexts of a server."""
    for b, ctx in itertools.product((1, 3, 8, 32, 128, 256, 1024), (1, 16, 129, 4096, 32768)):
        for hq, hkv, d, dv in ((64, 8, 64, 64), (32, 4, 128, 128), (128, 128, 192, 128), (4, 1, 16, 16)):
            for window, dtype in ((None, torch.bfloat16), (128, torch.bfloat16), (None, torch.float32), (1, torch.float16)):
                yield select.Shape(b, b, hq, hkv, d, dv, ctx, window, True, 16, dtype)


@pytest.mark.parametrize("name", TARGETS)
def test_choices_name_a_leaf_that_can_run_the_shape(name):
    """On the H200 the Triton leaves with tensor-core tiles and splits within the keys and one wave of programs; on the
    CPU (no compiled Triton) the reference; every kernel a registered backend's, every choice with its reason."""
    t = TARGETS[name]
    for s in shapes():
        for op, c in (("attention_prefill", select.select_prefill(t, s, triton=select.triton_on(t))),
                      ("attention_decode", select.select_decode(t, s, triton=select.triton_on(t)))):  # fmt: skip
            assert c.kernel.split(".")[0] in dispatch.backends(op) and c.reason, (op, s, c)
            assert (c.kernel == "torch") == (t.type != "cuda"), (op, s, c)
            if c.kernel == "torch":
                continue
            tiles = (c.config.block_n,) + ((c.config.block_m,) if op == "attention_prefill" else ())
            assert all(x >= 16 and x & (x - 1) == 0 for x in tiles), c
        if t.type != "cuda":
            continue
        cfg, keys = c.config, min(s.max_keys, s.window or s.max_keys)
        assert 1 <= cfg.num_splits <= max(1, -(-keys // cfg.block_n)), (s, c)
        assert cfg.num_splits == 1 or s.seqs * s.hkv * cfg.num_splits <= cfg.programs_per_sm * t.sms, (s, c)
        assert (c.kernel == "triton.decode") == (cfg.num_splits == 1)


def test_every_table_row_is_reached_with_tl_dot_tiles():
    """No row is dead: some call on its target selects it; every row has a reason and tiles tl.dot takes."""
    from quantkit.kernels.attention.tables import DECODE, PREFILL

    used = set()
    for s in shapes():
        for mode in ("compiled", "interpreter"):
            used.add(select.select_prefill(TARGETS["h200"], s, "triton", triton=mode).config)
            used.add(dataclasses.replace(select.select_decode(TARGETS["h200"], s, "triton", triton=mode).config, num_splits=0))
    for row in PREFILL + DECODE:
        assert row.config in used and row.reason, row
        tiles = [row.config.block_n] + ([row.config.block_m] if hasattr(row.config, "block_m") else [])
        assert all(x >= 16 and x & (x - 1) == 0 for x in tiles), row


@pytest.mark.parametrize("name", TARGETS)
def test_kernel_maps_name_leaves_of_their_ops(name):
    """``quantkit kernels``' rows for the attention ops: a leaf of a backend the target has, with its reason."""
    t = TARGETS[name]
    for op in ("attention_prefill", "attention_decode", "mla_decode"):
        rows = dispatch.REGISTRY.maps[op](t)
        assert rows and all(r.op == op and r.choice.reason for r in rows), op
        for r in rows:
            backend = r.choice.kernel.split(".")[0]
            assert backend in dispatch.backends(op) or backend in (t.optional or ()), r


@pytest.mark.parametrize(("lens", "window", "kernel"), [([300, 7], None, "triton.decode_split"), ([300, 7], 100, "triton.decode")])
def test_h200_decode_leaves_equal_the_reference(triton_device, lens, window, kernel):
    """Each decode leaf with the launch the H200 selects for this shape (the interpreter here, compiled on a GPU)."""
    kc, vc, bt, ctx = paged_cache(lens, 2, 16, 16, 16, torch.float32, triton_device)
    q, _, _, sinks = ragged([len(lens)], [1], 4, 2, 16, 16, torch.float32, triton_device)
    c = select.select_decode(TARGETS["h200"], select.decode_shape(q, kc, vc, bt, 16, sinks, window))
    assert c.kernel == kernel
    want = ref_ops.attention_decode(q, kc, vc, bt, ctx, 16, 0.25, sinks, window)
    got = triton("attention_decode", q, kc, vc, bt, ctx, 16, 0.25, sinks, window, config=c.config)
    assert_close(got, want, *TOL[torch.float32], f"{c}")


@pytest.mark.parametrize(("d", "dtype"), [(64, torch.bfloat16), (96, torch.bfloat16), (96, torch.float32)])
def test_h200_prefill_tiles_equal_the_reference(triton_device, d, dtype):
    """The prefill tiles the H200 selects per head dim and dtype (the interpreter here, compiled on a GPU)."""
    q, k, v, sinks = ragged([5, 70], [5, 70], 4, 2, d, d, dtype, triton_device)
    cu_ = cu([5, 70], triton_device)
    c = select.select_prefill(TARGETS["h200"], select.prefill_shape(q, k, v, cu_, sinks, None, None, 0))
    want = ref_ops.attention_prefill(*f32(q, k, v), cu_, cu_, d**-0.5, sinks)
    got = triton("attention_prefill", q, k, v, cu_, cu_, d**-0.5, sinks, config=c.config)
    assert_close(got, want, *tol(dtype, triton_device), f"{c}")


def test_dispatch_reports_the_leaf(triton_device):
    """``which`` with the call's arguments and ``Dispatcher.ran`` name the leaf the selection picked."""
    kc, vc, bt, ctx = paged_cache([9], 2, 16, 16, 4, torch.float32, triton_device)
    q, _, _, _ = ragged([1], [1], 4, 2, 16, 16, torch.float32, triton_device)
    ops = dispatch.Dispatcher(per_op={"attention_decode": "triton"})
    ops.call("attention_decode", q, kc, vc, bt, ctx, 4, 0.25)
    assert ops.ran["attention_decode"] == ops.which("attention_decode", q, kc, vc, bt, ctx, 4, 0.25) in ("triton.decode", "triton.decode_split")


