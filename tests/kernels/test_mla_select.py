"""mla_decode's selection (quantkit/kernels/mla/select.py): FlashInfer's MLA planned only where it serves, the Triton
splits within the keys and one wave, the H200-selected Triton leaves give the reference's bytes.  Budget: under 30 s."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from quantkit.kernels import dispatch
from quantkit.kernels.mla import mla_ref as ref_ops
from quantkit.kernels.mla import select

from .test_attention import TOL, assert_close
from .test_mla import latent_cache, queries, triton


DEEPSEEK_SHAPE = select.Shape(8, 128, 512, 64, 4096, 16)


@pytest.mark.parametrize("backend", ["auto", "flashinfer", "triton", "torch"])
def test_selection_plans_flashinfer_only_where_it_serves(backend):
    """FlashInfer's MLA runs planned once per step only where it serves the call (DeepSeek's dims, bf16, a plan store,
    no graph capture) and auto or flashinfer was asked for; an explicit backend is never replaced by another."""
    h200, cpu = dispatch.TARGETS["h200"], dispatch.Target("cpu", name="cpu")
    cases = {  # name -> (target, shape, planned, capturing, FlashInfer serves)
        "serves": (h200, DEEPSEEK_SHAPE, True, False, True),
        "capture": (h200, DEEPSEEK_SHAPE, True, True, False),
        "no plan store": (h200, DEEPSEEK_SHAPE, False, False, False),
        "rank": (h200, dataclasses.replace(DEEPSEEK_SHAPE, rank=256), True, False, False),
        "fp16": (h200, dataclasses.replace(DEEPSEEK_SHAPE, dtype=torch.float16), True, False, False),
        "not installed": (dataclasses.replace(h200, optional=frozenset()), DEEPSEEK_SHAPE, True, False, False),
    }
    want = {"auto": ("flashinfer.planned", "triton"), "flashinfer": ("flashinfer.planned", "flashinfer"), "triton": ("triton", "triton"),
            "torch": ("torch", "torch")}[backend]  # fmt: skip
    for name, (t, s, planned, capturing, serves) in cases.items():
        c = select.select_mla(t, s, backend, triton="compiled", planned=planned, capturing=capturing)
        assert (c.kernel.split(".")[0] if c.kernel.startswith("triton") else c.kernel) == want[not serves] and c.reason, (name, c)
    assert select.select_mla(cpu, DEEPSEEK_SHAPE, "auto", triton=None, planned=True).kernel == "torch"


def test_triton_choices_split_within_the_keys_and_one_wave():
    """Over batch sizes, heads and contexts on the H200: splits >= 1, <= the key blocks, more than one only while the
    programs of all but the last split fit two per SM; tiles tl.dot takes."""
    t = dispatch.TARGETS["h200"]
    for b, h, ctx in itertools.product((1, 2, 8, 32, 128, 256, 1024), (16, 20, 128), (1, 16, 512, 4096, 32768)):
        c = select.select_mla(t, select.Shape(b, h, 512, 64, ctx, 16), "triton")
        cfg = c.config
        groups = b * -(-h // cfg.block_h)
        assert 1 <= cfg.num_splits <= max(1, -(-ctx // cfg.block_n)), c
        assert cfg.num_splits == 1 or groups * (cfg.num_splits - 1) < 2 * t.sms, c
        assert cfg.block_h >= 16 and cfg.block_n >= 16 and (c.kernel == "triton.mla_decode") == (cfg.num_splits == 1)


@pytest.mark.parametrize(("b", "kernel"), [(2, "triton.mla_decode_split"), (264, "triton.mla_decode")])
def test_h200_triton_leaves_equal_the_reference(triton_device, b, kernel):
    """Each Triton leaf with the launch the H200 selects (the interpreter here, compiled on a GPU)."""
    lens = [300, 7] if b == 2 else [1 + i % 20 for i in range(b)]
    kv, k_rot, bt, ctx = latent_cache(lens, 32, 16, 16, torch.float32, triton_device)
    q_lat, q_rot = queries(b, 4, 32, 16, torch.float32, triton_device)
    c = select.select_mla(dispatch.TARGETS["h200"], select.Shape(b, 4, 32, 16, bt.shape[1] * 16, 16, torch.float32), "triton")
    assert c.kernel == kernel
    want = ref_ops.mla_decode(q_lat, q_rot, kv, k_rot, bt, ctx, 16, 0.2)
    assert_close(triton(q_lat, q_rot, kv, k_rot, bt, ctx, 16, 0.2, config=c.config), want, *TOL[torch.float32], str(c))


