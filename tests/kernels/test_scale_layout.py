"""MN-major activation scales (``scale_mn``): the quantizers (plain, RMSNorm, SiLU-and-mul, SwiGLU; the
torch references and the Triton kernels) write the same values as the row-major layout, into the
[G, M rounded up to 4] buffer DeepGEMM reads, padding zeroed; every GEMM kernel reads either layout
to the same bits; the engine serves the same logits with it.  Triton runs compiled on CUDA, else in
the CPU interpreter."""

from __future__ import annotations

import pytest
import torch
from .test_gemm import fp8_block_case

from quantkit.formats import fp8_block
from quantkit.kernels import dispatch


def _poisoned_buffers(monkeypatch):
    """Scale buffers start as NaN, so padding the kernels forget to zero shows."""
    real = fp8_block.empty_act_scales

    def poisoned(lead, groups, device, scale_mn=False):
        s = real(lead, groups, device, scale_mn)
        base = fp8_block.mn_major_storage(s) if scale_mn else s
        base.fill_(float("nan"))
        return s

    monkeypatch.setattr(fp8_block, "empty_act_scales", poisoned)


def _check_mn(s_mn: torch.Tensor, s_row: torch.Tensor) -> None:
    assert s_mn.shape == s_row.shape and torch.equal(s_mn, s_row), "the same values in either layout"
    base = fp8_block.mn_major_storage(s_mn)
    assert base is not None, f"not MN-major: strides {s_mn.stride()}"
    m = s_row.numel() // s_row.shape[-1]
    assert base.shape == (s_row.shape[-1], fp8_block.mn_rows(m))
    assert torch.equal(base[:, :m].cpu(), s_row.reshape(m, -1).t().cpu())
    assert torch.equal(base[:, m:], torch.zeros_like(base[:, m:])), f"padding columns not zero: {base[:, m:]}"


def test_mn_major_storage_recognises_only_the_layout():
    s = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    assert fp8_block.mn_major_storage(s) is None, "row-major"
    assert fp8_block.mn_major_storage(s.t().contiguous().t()) is None, "a transpose without the padding columns"
    mn = fp8_block.act_scales_mn(s)
    assert mn.stride() == (1, 8) and torch.equal(mn, s)
    base = fp8_block.mn_major_storage(mn)
    assert base.shape == (3, 8) and base.data_ptr() == mn.data_ptr() and not base[:, 5:].any()
    assert fp8_block.mn_major_storage(mn.to(torch.float64)) is None
    lead = fp8_block.act_scales_mn(torch.ones(2, 3, 4))  # [B, T, G]: tokens row-major over B, T
    assert lead.stride() == (3, 1, 8) and fp8_block.mn_major_storage(lead).shape == (4, 8)
    one = fp8_block.act_scales_mn(torch.ones(1, 1))
    assert one.stride()[-1] == 4 and fp8_block.mn_major_storage(one).shape == (1, 4)


@pytest.mark.parametrize("shape", [(1, 300), (5, 256), (2, 3, 384), (8, 128), (1, 128)])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_quantizers_write_mn_major(triton_device, gen, monkeypatch, shape, backend):
    dev = triton_device if backend == "triton" else torch.device("cpu")
    _poisoned_buffers(monkeypatch)
    x = (torch.randn(*shape, generator=gen) * 3).to(torch.bfloat16).to(dev)
    w = torch.randn(shape[-1], generator=gen).to(torch.bfloat16).to(dev)
    gu = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen).to(torch.bfloat16).to(dev)
    calls = {
        "act_quant_fp8_block": ((x, "float", "rceil"), {}),
        "rmsnorm_act_quant": ((x, w, 1e-6, "fp8-block", "ue8m0", "rceil", "hf"), {}),
        "silu_mul_act_quant": ((gu[..., : shape[-1]], gu[..., shape[-1] :], "fp8-block"), {}),
        "swiglu_act_quant": ((gu, "fp8-block"), {}),
    }
    for op, (args, kw) in calls.items():
        q0, s0 = dispatch.call(op, *args, backend=backend, **kw)
        q1, s1 = dispatch.call(op, *args, backend=backend, scale_mn=True, **kw)
        assert torch.equal(q0.view(torch.uint8), q1.view(torch.uint8)), f"{op}: the bytes do not depend on the scale layout"
        _check_mn(s1, s0)


@pytest.mark.parametrize("op,args", [
    ("rmsnorm_act_quant", lambda x: (x, torch.ones(64, dtype=torch.bfloat16), 1e-6, "mxfp8")),
    ("silu_mul_act_quant", lambda x: (x, x, "mxfp8")),
    ("swiglu_act_quant", lambda x: (x, "mxfp8")),
])  # fmt: skip
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_mn_major_is_fp8_block_only(triton_device, op, args, backend):
    dev = triton_device if backend == "triton" else torch.device("cpu")
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="MN-major scales .* fp8-block layout, not mxfp8"):
        dispatch.call(op, *(t.to(dev) if isinstance(t, torch.Tensor) else t for t in args(x)), backend=backend, scale_mn=True)


@pytest.mark.parametrize("m,n,k", [(1, 256, 640), (7, 384, 300), (24, 256, 512), (70, 256, 384)])
def test_gemms_read_either_layout(triton_device, gen, m, n, k):
    """The Triton op (small-M kernel to M = 32, tiles above; wgmma on sm_90) and the reference: same bits."""
    a, sa, q, sw, b = fp8_block_case(m, n, k, gen, True, triton_device)
    sa_mn = fp8_block.act_scales_mn(sa)
    for backend in ("torch", "triton"):
        out = dispatch.call("gemm_fp8_block", a, sa, q, sw, b, backend=backend)
        assert torch.equal(dispatch.call("gemm_fp8_block", a, sa_mn, q, sw, b, backend=backend), out), backend
    c = dispatch.choose("gemm_fp8_block", a, sa_mn, q, sw, b, backend="triton")
    assert c == dispatch.choose("gemm_fp8_block", a, sa, q, sw, b, backend="triton"), "the layout does not change the kernel chosen"


def test_cublas_layout_takes_the_buffer_when_its_rows_match():
    from quantkit.kernels.gemm import scaled_mm as sm

    a = torch.zeros(16, 384, dtype=torch.float8_e4m3fn)
    s = fp8_block.act_scales_mn(torch.rand(16, 3))
    _, sa = sm.prepare_act(a, s, 384)  # M' = 16 rows: the quantizer's own buffer
    assert sa.data_ptr() == s.data_ptr() and sa.stride() == (1, 16) and torch.equal(sa, s)
    s5 = fp8_block.act_scales_mn(torch.rand(5, 3))  # 8 columns, cuBLAS wants 16: one copy, zero padding
    ap, sa5 = sm.prepare_act(a[:5], s5, 384)
    assert ap.shape == (16, 384) and sa5.data_ptr() != s5.data_ptr()
    assert torch.equal(sa5[:5], s5) and not sa5[5:].any()
