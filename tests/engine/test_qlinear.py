"""Quantized linear numerics: each packed format computes what its serving kernel computes.

fp8-block is checked against DeepSeek's fp8_gemm semantics written out independently here (per
128-wide K block: E4M3 products summed in f32, times the activation's and the weight tile's
scales), and against dequant(act_quant(x)) @ dequant(W).T in f32; mxfp8 against its 1x32 blocks
the same way; mxfp4 against a hand-decoded E2M1 table.  Shapes are awkward on purpose: M = 1,
K and N not multiples of 128 (partial tiles).
"""

from __future__ import annotations

import pytest
import torch

from quantkit.engine.qlinear import ActQuant, Dense, Fp8Block, Linear, Mxfp4, Mxfp8, linear
from quantkit.formats import fp8_block, mxfp4, mxfp8

FP8 = ActQuant("fp8-block")
FP8_UE8M0 = ActQuant("fp8-block", "ue8m0")
MX = ActQuant("mxfp8")


def _data(gen: torch.Generator, m: int, n: int = 200, k: int = 320) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(m, k, generator=gen) * torch.linspace(0.1, 4, k)  # channels of different ranges
    return x, torch.randn(n, k, generator=gen) * 0.05


def _deepseek_fp8_gemm(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, scale_fmt: str) -> torch.Tensor:
    """DeepSeek inference/kernel.py fp8_gemm, in torch: acc += (qx_kb @ qw_kb^T) * sx_kb * sw_tile."""
    k = x.shape[1]
    acc = torch.zeros(x.shape[0], q.shape[0])
    for kb in range(0, k, 128):
        xs = x[:, kb : kb + 128]
        amax = xs.abs().amax(-1, keepdim=True).clamp(min=1e-4)
        sx = amax / 448 if scale_fmt == "float" else 2.0 ** torch.ceil(torch.log2(amax / 448))
        qx = (xs / sx).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        sw = s[:, kb // 128].repeat_interleave(128)[: q.shape[0]]
        acc += (qx @ q[:, kb : kb + 128].float().T) * sx * sw
    return acc


@pytest.mark.parametrize("m", [1, 7])
@pytest.mark.parametrize("act", [FP8, FP8_UE8M0], ids=["float", "ue8m0"])
def test_fp8_block_matches_deepseek_gemm(gen: torch.Generator, m: int, act: ActQuant) -> None:
    x, w = _data(gen, m)
    q, s = fp8_block.quantize_weight(w, act.scale_fmt)
    y = linear(x, Fp8Block(q, s, act))
    ref = _deepseek_fp8_gemm(x, q, s, act.scale_fmt)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    spec = fp8_block.dequantize_act(*fp8_block.quantize_act(x, act.scale_fmt)) @ fp8_block.dequantize_weight(q, s).T
    torch.testing.assert_close(y, spec, rtol=1e-6, atol=1e-6)
    assert (y - x @ fp8_block.dequantize_weight(q, s).T).abs().max() > 0  # activations really were quantized


def test_mxfp8_quantizes_activations_per_32(gen: torch.Generator) -> None:
    x, w = _data(gen, 5, n=96, k=224)
    q, s = mxfp8.quantize(w)
    y = linear(x, Mxfp8(q, s, MX))
    per_block = torch.zeros(5, 96)
    for kb in range(0, 224, 32):  # one E8M0 scale per 32 inputs on each side
        qx, sx = mxfp8.quantize(x[:, kb : kb + 32])
        xd = mxfp8.dequantize(qx, sx)
        per_block += xd @ mxfp8.dequantize(q[:, kb : kb + 32], s[:, kb // 32 : kb // 32 + 1]).T
    torch.testing.assert_close(y, per_block, rtol=1e-5, atol=1e-5)
    assert (y - linear(x, Mxfp8(q, s, None))).abs().max() > 0


def test_mxfp4_decodes_e2m1_table_low_nibble_first() -> None:
    # one output row, 32 inputs: byte 0x21 = (low 1 -> +0.5, high 2 -> +1.0); 0xF9 = (low 9 -> -0.5, high 15 -> -6)
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0], blocks[0, 0, 1] = 0x21, 0xF9
    scales = torch.tensor([[128]], dtype=torch.uint8)  # 2**1
    x = torch.zeros(2, 32)
    x[0, :4] = torch.tensor([1.0, 10.0, 100.0, 1000.0])
    x[1, 3] = 1.0
    y = linear(x, Mxfp4(blocks, scales))
    assert y[:, 0].tolist() == [2 * (0.5 + 10 * 1.0 - 100 * 0.5 - 1000 * 6.0), 2 * -6.0]


def test_dense_bias_and_dtype(gen: torch.Generator) -> None:
    x, w = _data(gen, 3)
    b = torch.randn(200, generator=gen).bfloat16()
    lin = Linear(Dense(w.bfloat16()), b)
    ref = torch.nn.functional.linear(x, w.bfloat16().float(), b.float())
    torch.testing.assert_close(lin(x), ref, rtol=1e-6, atol=1e-6)
    assert lin(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("fmt", ["dense", "fp8-block", "mxfp8", "mxfp4"])
def test_stacked_experts_select_their_slice(gen: torch.Generator, fmt: str) -> None:
    x, w = _data(gen, 4, n=64, k=128)
    ws = torch.stack([w, -2 * w, w.flip(0)])
    make = {
        "dense": lambda t: Dense(t),
        "fp8-block": lambda t: Fp8Block(*fp8_block.quantize_weight(t), FP8),
        "mxfp8": lambda t: Mxfp8(*mxfp8.quantize(t), MX),
        "mxfp4": lambda t: Mxfp4(*mxfp4.encode(t)),
    }[fmt]
    stacked = make(ws)
    assert stacked.num_experts == 3 and stacked.shape == (64, 128)
    for e in range(3):
        torch.testing.assert_close(linear(x, stacked, expert=e), linear(x, make(ws[e])), rtol=0, atol=0)


def test_rejected_layouts(gen: torch.Generator) -> None:
    x, w = _data(gen, 2, n=64, k=96)
    q, s = fp8_block.quantize_weight(w)
    with pytest.raises(ValueError, match="needs F8_E4M3 and scales"):
        Fp8Block(q, s[:, :0], FP8)
    with pytest.raises(ValueError, match="K % 32"):
        Mxfp8(q[:, :80], torch.zeros(64, 2, dtype=torch.uint8), MX)
    with pytest.raises(ValueError, match="not U8"):
        Mxfp4(torch.zeros(64, 3, 15, dtype=torch.uint8), torch.zeros(64, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="input has 95 features"):
        linear(x[:, :95], Fp8Block(q, s, FP8))


def test_dispatcher_records_backends(gen: torch.Generator) -> None:
    x, w = _data(gen, 2)
    weight = Fp8Block(*fp8_block.quantize_weight(w), FP8)
    linear(x, weight)
    assert weight.ops.ran == {"act_quant_fp8_block": "torch", "gemm_fp8_block": "torch"}  # act_quant + GEMM, no dequant
    mx = Mxfp8(*mxfp8.quantize(w), MX)
    linear(x, mx)
    assert mx.ops.ran == {"act_quant_mxfp8": "torch", "gemm_mxfp8": "torch"}
    plain = Fp8Block(*fp8_block.quantize_weight(w), None)  # unquantized activations: dequantize + f32 matmul
    linear(x, plain)
    assert plain.ops.ran == {"fp8_block_dequant": "torch"}
    with pytest.raises(ValueError, match="no GEMM"):
        Fp8Block(*fp8_block.quantize_weight(w), MX)


# ---- fuse_rows: several projections of one input as one GEMM ----------------------------------

FUSABLE = {
    "dense": lambda t, act: Dense(t),
    "fp8-block": lambda t, act: Fp8Block(*fp8_block.quantize_weight(t), ActQuant("fp8-block") if act else None),
    "mxfp8": lambda t, act: Mxfp8(*mxfp8.quantize(t), ActQuant("mxfp8") if act else None),
    "mxfp4": lambda t, act: Mxfp4(*mxfp4.encode(t)),
}


@pytest.mark.parametrize("fmt", list(FUSABLE))
@pytest.mark.parametrize("bias", [False, True])
def test_fuse_rows_is_one_gemm_over_shared_storage(fmt: str, bias: bool) -> None:
    """DeepSeek's q_a_proj + kv_a_proj_with_mqa shape (whole 128-row tiles first, a ragged last part): the
    fused output is the parts' outputs side by side, and each part reads its rows of the fused buffers."""
    from quantkit.engine.qlinear import fuse_rows

    gen = torch.Generator().manual_seed(11)
    ws = [torch.randn(n, 320, generator=gen) / 18 for n in (256, 72)]
    parts = [Linear(FUSABLE[fmt](w, True), torch.randn(w.shape[0], generator=gen) if bias else None) for w in ws]
    before = [p.weight.dequant() for p in parts]
    x = torch.randn(5, 320, generator=gen).to(torch.bfloat16)
    want = torch.cat([p(x) for p in parts], dim=-1)
    fused = fuse_rows(parts)
    assert fused is not None and fused.weight.shape == (328, 320)
    for p, w in zip(parts, before, strict=True):
        assert torch.equal(p.weight.dequant(), w), "a part still reads its own rows"
        for name, t in p.weight.named_buffers():
            assert t.untyped_storage().data_ptr() == getattr(fused.weight, name).untyped_storage().data_ptr(), f"{fmt} {name} is not shared"
    got = fused(x)
    assert torch.equal(got, want), "each output element is the same dot product"
    assert torch.equal(torch.cat([p(x) for p in parts], dim=-1), want), "the parts give what they gave before fusing"


def test_row_group_fuses_once_and_again_after_a_move() -> None:
    """The fused projection is built on first use and then kept (fuse_rows re-points the parts' buffers, so the
    cache key must be taken after it); replacing the parts' buffers (a ``.to``) builds it again."""
    from quantkit.engine import qlinear as qmod

    gen = torch.Generator().manual_seed(13)
    parts = [Linear(FUSABLE["fp8-block"](torch.randn(n, 256, generator=gen) / 16, True)) for n in (128, 72)]
    group = qmod.RowGroup(parts)
    first = group.fused()
    assert first is not None and group.fused() is first, "rebuilt without a change"
    x = torch.randn(3, 256, generator=gen).to(torch.bfloat16)
    group(x)
    assert group.fused() is first, "a call rebuilt it"
    for p in parts:  # every buffer replaced, as a move to another device does: the old fused storage is stale
        for name, t in list(p.weight.named_buffers()):
            setattr(p.weight, name, t.clone())
    again = group.fused()
    assert again is not None and again is not first and group.fused() is again


def test_fuse_rows_refuses_what_cannot_stack() -> None:
    from quantkit.engine.qlinear import fuse_rows

    gen = torch.Generator().manual_seed(12)
    w = lambda n: torch.randn(n, 256, generator=gen) / 16  # noqa: E731
    fp8 = lambda n, act=True: Linear(FUSABLE["fp8-block"](w(n), act))  # noqa: E731
    assert fuse_rows([fp8(200), fp8(72)]) is None, "a part before the last must be whole 128-row scale tiles"
    assert fuse_rows([fp8(128), fp8(72, act=False)]) is None, "activation quantization differs"
    assert fuse_rows([fp8(128), Linear(Dense(w(72)))]) is None, "formats differ"
    assert fuse_rows([fp8(128)]) is None, "nothing to fuse"
    assert fuse_rows([Linear(Dense(w(8)), torch.zeros(8)), Linear(Dense(w(8)))]) is None, "a bias on one part only"
    assert fuse_rows([Linear(Dense(w(8))), Linear(Dense(torch.randn(8, 128)))]) is None, "K differs"
    assert fuse_rows([Linear(Dense(w(8))), Linear(Dense(w(8).to(torch.bfloat16)))]) is None, "dtypes differ"
    assert fuse_rows([Linear(Dense(torch.zeros(2, 8, 256))), Linear(Dense(torch.zeros(2, 8, 256)))]) is None, "stacked experts"
    assert fuse_rows([fp8(128), fp8(72)]) is not None


@pytest.mark.parametrize(("hd", "hq"), [(64, 4), (32, 6)])  # q / k rows 256 / 128: one GEMM; 192 / 64: not whole FP8 scale tiles
def test_attention_runs_q_k_v_as_one_projection(monkeypatch: pytest.MonkeyPatch, hd: int, hq: int) -> None:
    """The GQA layer's q / k / v (GPT-OSS-like: biases, sinks, window) as one GEMM where they stack, with the
    same outputs as three, fused input norm included (bf16)."""
    from quantkit.engine import KVCache
    from quantkit.engine import qlinear as qmod
    from quantkit.engine.layers.attention import Attention
    from quantkit.engine.layers.norm import RMSNorm
    from quantkit.engine.layers.rope import Rope

    def layer() -> Attention:
        gen = torch.Generator().manual_seed(21)
        hkv, hidden = 2, 256

        def proj(n: int, k: int) -> Linear:
            w = torch.randn(n, k, generator=gen) / k**0.5
            return Linear(Fp8Block(*fp8_block.quantize_weight(w), ActQuant("fp8-block")), torch.randn(n, generator=gen).to(torch.bfloat16))

        return Attention(0, proj(hq * hd, hidden), proj(hkv * hd, hidden), proj(hkv * hd, hidden), proj(hidden, hq * hd), num_heads=hq,
                         num_kv_heads=hkv, head_dim=hd, rope=Rope(hd, {"rope_type": "default", "rope_theta": 10000.0}),
                         sinks=torch.randn(hq, generator=gen), window=4)  # fmt: skip

    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    norm = RMSNorm(torch.ones(256, dtype=torch.bfloat16), 1e-6)

    def run(attn: Attention) -> torch.Tensor:
        cache = KVCache([attn.cache_spec()], num_blocks=8, block_size=4, dtype=torch.bfloat16)
        with torch.no_grad():
            outs = [attn.forward_normed(norm, x[:6], cache.schedule({"s": 6}), cache)]
            outs += [attn.forward_normed(norm, x[i : i + 1], cache.schedule({"s": 1}), cache) for i in range(6, 9)]
        return torch.cat(outs)

    fused_attn = layer()
    fused = run(fused_attn)
    assert (fused_attn.qkv.fused() is not None) == (hd == 64)
    monkeypatch.setattr(qmod, "fuse_rows", lambda parts: None)
    plain_attn = layer()
    plain = run(plain_attn)
    assert plain_attn.qkv.fused() is None
    assert torch.equal(fused, plain)


@pytest.mark.parametrize("inter", [256, 96])  # 96: FP8-block gate not whole scale tiles -> two GEMMs
def test_mlp_runs_gate_and_up_as_one_projection(monkeypatch: pytest.MonkeyPatch, inter: int) -> None:
    """Dense SwiGLU MLP (DeepSeek's shared experts: gate / up 2048 x 7168 each): one GEMM and one input
    quantization where gate and up stack, the same outputs as two (bf16 with the fused SiLU-and-mul
    quantization, and float32 through the unfused formula)."""
    from quantkit.engine import qlinear as qmod
    from quantkit.engine.layers.mlp import MLP

    def mlp() -> MLP:
        gen = torch.Generator().manual_seed(31)

        def proj(n: int, k: int) -> Linear:
            return Linear(Fp8Block(*fp8_block.quantize_weight(torch.randn(n, k, generator=gen) / k**0.5), ActQuant("fp8-block")))

        return MLP(proj(inter, 192), proj(inter, 192), proj(192, inter))

    x = torch.randn(7, 192, generator=torch.Generator().manual_seed(2))
    fused_mlp = mlp()
    fused = [fused_mlp(x.to(dt)) for dt in (torch.bfloat16, torch.float32)]
    assert (fused_mlp.gate_up.fused() is not None) == (inter % 128 == 0)
    monkeypatch.setattr(qmod, "fuse_rows", lambda parts: None)
    plain_mlp = mlp()
    plain = [plain_mlp(x.to(dt)) for dt in (torch.bfloat16, torch.float32)]
    assert plain_mlp.gate_up.fused() is None
    for f, p in zip(fused, plain, strict=True):
        assert torch.equal(f, p)
