"""The scenarios of :mod:`.sm90_launches`: each runs some ops' Triton launchers at the served models' shapes (a few
tokens each, small CPU tensors), so their launches can be captured and compiled for sm_90."""

from __future__ import annotations

from .sm90_launches import SELFTESTS, scenario

# ---- scenarios: the served models' shapes at a few tokens ----------------------------------------------------


def _g():
    import torch

    return torch.Generator().manual_seed(0)


def _randn(*shape, dtype=None):
    import torch

    return torch.randn(*shape, generator=_g()).to(dtype or torch.bfloat16)


def _call(op: str, *args, **kwargs):
    """The op's registered Triton backend: its selection (as on the H200), then the leaf it picks."""
    from quantkit.kernels import dispatch

    b = dispatch.REGISTRY.ops[op]["triton"]
    return b.run(*args, **kwargs)


def _paged(b: int, hkv: int, d: int, dv: int, ctx: list[int], page: int = 16, dtype=None):
    """A paged KV cache [slots, Hkv, D/Dv] with int64 block tables [B, max_blocks] and int32 context lengths."""
    import torch

    n_blocks = [-(-c // page) for c in ctx]
    width = max(n_blocks)
    tables = torch.full((b, width), -1, dtype=torch.int64)
    nxt = 0
    for i, nb in enumerate(n_blocks):
        tables[i, :nb] = torch.arange(nxt, nxt + nb)
        nxt += nb
    slots = max(nxt, 1) * page
    return (_randn(slots, hkv, d, dtype=dtype), _randn(slots, hkv, dv, dtype=dtype), tables,
            torch.tensor(ctx, dtype=torch.int32))  # fmt: skip


ATTN_MODELS = {  # (hq, hkv, d, dv, sinks, window)
    "gpt_oss": (64, 8, 64, 64, True, 128),
    "qwen3": (32, 4, 128, 128, False, None),
}


def _prefill(hq, hkv, d, dv, sinks, window, paged=False, dtype=None):
    import torch

    lens_q, lens_k = [100, 37], ([300, 37] if paged else [100, 37])
    t = sum(lens_q)
    q = _randn(t, hq, d, dtype=dtype)
    cu_q = torch.tensor([0, lens_q[0], t], dtype=torch.int32)
    cu_k = torch.tensor([0, lens_k[0], sum(lens_k)], dtype=torch.int32)
    s = _randn(hq, dtype=dtype) if sinks else None
    if paged:
        k, v, tables, _ = _paged(2, hkv, d, dv, lens_k, dtype=dtype)
        _call("attention_prefill", q, k, v, cu_q, cu_k, d**-0.5, s, window, tables, 16)
    else:
        k, v = _randn(t, hkv, d, dtype=dtype), _randn(t, hkv, dv, dtype=dtype)
        _call("attention_prefill", q, k, v, cu_q, cu_k, d**-0.5, s, window)


@scenario("attention_prefill_gpt_oss", ("attention_prefill",), ("_prefill_kernel",))
def _():
    _prefill(*ATTN_MODELS["gpt_oss"])
    _prefill(*ATTN_MODELS["gpt_oss"][:5], None)  # GPT-OSS's full-attention layers
    _prefill(*ATTN_MODELS["gpt_oss"], paged=True)  # chunked prefill over the cache


@scenario("attention_prefill_qwen3_deepseek", ("attention_prefill",), ("_prefill_kernel",))
def _():
    import torch

    _prefill(*ATTN_MODELS["qwen3"])
    _prefill(16, 16, 192, 128, False, None)  # DeepSeek-V3 MLA prefill: d 192, dv 128
    _prefill(*ATTN_MODELS["qwen3"], dtype=torch.float32)  # float32's own tiles


def _decode(hq, hkv, d, dv, sinks, window, b, ctx):
    k, v, tables, lens = _paged(b, hkv, d, dv, [ctx] * b)
    s = _randn(hq) if sinks else None
    _call("attention_decode", _randn(b, hq, d), k, v, tables, lens, 16, d**-0.5, s, window)


@scenario("attention_decode", ("attention_decode",), ("_decode_split_kernel", "_decode_merge_kernel"))
def _():
    for model in ("gpt_oss", "qwen3"):
        _decode(*ATTN_MODELS[model], b=1, ctx=1000)  # several KV splits, then the merge
        _decode(*ATTN_MODELS[model], b=64, ctx=40)  # one split writes the output
    _decode(*ATTN_MODELS["gpt_oss"][:5], None, b=2, ctx=700)


@scenario("rope", ("rope_rotate", "rope_cache_write"), ("_rope_kernel", "_rope_cache_kernel"))
def _():
    import torch

    for dtype in (torch.bfloat16, torch.float32):
        for style, (hq, hkv, d) in (("half", (32, 4, 128)), ("interleaved", (64, 8, 64))):
            t = 7
            cos, sin = _randn(t, d // 2, dtype=dtype), _randn(t, d // 2, dtype=dtype)
            _call("rope_rotate", _randn(t, hq, d, dtype=dtype), cos, sin, style)
            q, k, v = _randn(t, hq, d, dtype=dtype), _randn(t, hkv, d, dtype=dtype), _randn(t, hkv, d, dtype=dtype)
            kc, vc = torch.zeros(64, hkv, d, dtype=dtype), torch.zeros(64, hkv, d, dtype=dtype)
            _call("rope_cache_write", q, k, v, cos, sin, style, torch.arange(t, dtype=torch.int64) + 3, kc, vc)


@scenario("add_rmsnorm", ("add_rmsnorm",), ("_add_rmsnorm_kernel",))
def _():
    import torch

    for k, dtype, order in ((2880, torch.bfloat16, "hf"), (7168, torch.bfloat16, "f32"), (2048, torch.float32, "hf")):
        _call("add_rmsnorm", _randn(5, k, dtype=dtype), _randn(5, k, dtype=dtype), _randn(k, dtype=dtype), 1e-6, order)


@scenario("router_topk", ("router_topk",), ("_router_kernel",))
def _():
    _call("router_topk", _randn(3, 2880), _randn(32, 2880), _randn(32), 4, "topk_softmax")  # GPT-OSS
    _call("router_topk", _randn(3, 2048), _randn(128, 2048), None, 8, "softmax_topk", True)  # Qwen3-MoE


# -- MoE: one call per row of the H200's table, both formats, both gate/up layouts


def _experts(fmt: str, e: int, n: int, k: int, bias: bool):
    import torch

    from quantkit.kernels.moe.fused_moe_ref import ExpertWeights

    q = torch.zeros(e, n, k, dtype=torch.float8_e4m3fn)
    if fmt == "fp8-block":
        s = torch.ones(e, -(-n // 128), -(-k // 128))
    else:
        s = torch.full((e, n, k // 32), 127, dtype=torch.uint8)
    return ExpertWeights(fmt, q, s, _randn(e, n) if bias else None)


def _moe(fmt: str, interleaved: bool, tokens: tuple[int, ...], e: int = 64, top_k: int = 2, h: int = 256, inter: int = 256):
    import torch

    from quantkit.kernels.moe.fused_moe_ref import MoeSpec

    spec = MoeSpec("gpt-oss", True) if interleaved else MoeSpec("silu", False)
    w13 = _experts(fmt, e, 2 * inter, h, interleaved)
    w2 = _experts(fmt, e, h, inter, interleaved)
    for t in tokens:
        ids = (torch.arange(t * top_k, dtype=torch.int64).reshape(t, top_k) * 7) % e
        _call("fused_moe", _randn(t, h), torch.full((t, top_k), 0.5), ids, w13, w2, spec)


MOE_TOKENS = (1, 16, 512, 1536, 5120)  # 1/32, 0.5, 16, 48, 160 pairs per expert (E 64, top 2)
MOE_PREFILL = (8192,)


@scenario("fused_moe_fp8_block_steps", ("fused_moe",), ("_moe_gemm_kernel", "_combine_kernel", "_align_small_kernel", "_align_kernel", "_group_quant_kernel"))
def _():
    _moe("fp8-block", False, MOE_TOKENS)
    _moe("fp8-block", True, MOE_TOKENS[:2])


@scenario("fused_moe_mxfp8_steps", ("fused_moe",), ("_moe_gemm_kernel", "_combine_kernel", "_group_quant_kernel"))
def _():
    _moe("mxfp8", True, MOE_TOKENS)
    _moe("mxfp8", False, MOE_TOKENS[:2])


@scenario("fused_moe_sorted", ("fused_moe",), ("_sorted_gemm_kernel", "_combine_kernel", "_group_quant_kernel"))
def _():
    _moe("mxfp8", True, MOE_PREFILL)
    _moe("mxfp8", False, MOE_PREFILL)
    from quantkit.kernels.moe import tables

    _moe_config("fp8-block", False, tables.PREFILL_TILED)  # FP8-block prefill where the wgmma kernel cannot run


def _moe_config(fmt: str, interleaved: bool, cfg, t: int = 8192, e: int = 64, top_k: int = 2, h: int = 256, inter: int = 256):
    import torch

    from quantkit.kernels.moe import fused_moe
    from quantkit.kernels.moe.fused_moe_ref import MoeSpec

    spec = MoeSpec("gpt-oss", True) if interleaved else MoeSpec("silu", False)
    w13, w2 = _experts(fmt, e, 2 * inter, h, interleaved), _experts(fmt, e, h, inter, interleaved)
    ids = (torch.arange(t * top_k, dtype=torch.int64).reshape(t, top_k) * 7) % e
    fused_moe.fused_moe(_randn(t, h), torch.full((t, top_k), 0.5), ids, w13, w2, spec, config=cfg)


@scenario("fused_moe_sorted_wgmma", ("fused_moe",), ("moe_gemm_ws", "_combine_kernel", "_group_quant_kernel"))
def _():
    from dataclasses import replace

    from quantkit.kernels.moe import tables

    _moe("fp8-block", False, MOE_PREFILL)
    _moe("fp8-block", True, MOE_PREFILL)
    row = tables.H200["fp8-block"][-1].config
    _moe_config("fp8-block", False, replace(row, block_m=128))  # the kernel's other expert block


# -- GEMMs: every Triton row of the H200's tables, through the op's selection


def _gemm_operands(fmt: str, m: int, n: int, k: int):
    import torch

    a = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    w = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    if fmt == "fp8-block":
        return a, torch.ones(m, -(-k // 128)), w, torch.ones(-(-n // 128), -(-k // 128))
    return a, torch.full((m, k // 32), 127, dtype=torch.uint8), w, torch.full((n, k // 32), 127, dtype=torch.uint8)


def _gemm(op: str, fmt: str, m: int, n: int, k: int, bias: bool = False, out_dtype=None, backend: str = "triton", config=None):
    import torch

    from quantkit.kernels import dispatch

    a, sa, w, sw = _gemm_operands(fmt, m, n, k)
    b = _randn(n) if bias else None
    out_dtype = out_dtype or torch.bfloat16
    kw = {} if config is None else {"config": config}
    c = dispatch.REGISTRY.ops[op][backend].choose(a, sa, w, sw, b, out_dtype, **kw)
    c.run(a, sa, w, sw, b, out_dtype)
    return c


@scenario("gemm_fp8_block_skinny", ("gemm_fp8_block",), ("_skinny_kernel",))
def _():
    _gemm("gemm_fp8_block", "fp8-block", 1, 2880, 2880, bias=True)  # K not split
    _gemm("gemm_fp8_block", "fp8-block", 4, 7168, 16384)  # split-K
    _gemm("gemm_fp8_block", "fp8-block", 32, 2112, 7168)  # the K > 4096 row
    _gemm("gemm_fp8_block", "fp8-block", 7, 576, 200)  # K % 128 != 0, partial scale tiles


@scenario("gemm_fp8_block_wgmma", ("gemm_fp8_block",), ("fp8_block_gemm_ws",))
def _():
    import torch

    _gemm("gemm_fp8_block", "fp8-block", 48, 5120, 2880)  # M 33-64
    _gemm("gemm_fp8_block", "fp8-block", 128, 2112, 7168)  # narrow tiles, split-K
    _gemm("gemm_fp8_block", "fp8-block", 1024, 2880, 4096, bias=True)  # large M
    _gemm("gemm_fp8_block", "fp8-block", 300, 2888, 512, out_dtype=torch.float32)  # float32 out
    _gemm("gemm_fp8_block", "fp8-block", 300, 2890, 512)  # output rows not 16-byte aligned: masked stores


@scenario("gemm_fp8_block_tiled", ("gemm_fp8_block",), ("_tiled_kernel",))
def _():
    from quantkit.kernels.gemm import tables

    _gemm("gemm_fp8_block", "fp8-block", 200, 2880, 2888)  # rows not 16-byte aligned: no wgmma, no TMA
    _gemm("gemm_fp8_block", "fp8-block", 2000, 2880, 2888)
    _gemm("gemm_fp8_block", "fp8-block", 300, 2880, 2880, config=tables.TILED_MID)  # the tiles of every other device
    _gemm("gemm_fp8_block", "fp8-block", 2000, 2880, 2880, bias=True, config=tables.TILED_LARGE)  # TMA, persistent off


@scenario("gemm_mxfp8", ("gemm_mxfp8",), ("_skinny_kernel", "_tiled_kernel", "_mx_to_bf16_kernel"))
def _():
    _gemm("gemm_mxfp8", "mxfp8", 1, 2880, 2880, bias=True)
    _gemm("gemm_mxfp8", "mxfp8", 48, 2880, 2880)  # upcast skinny
    _gemm("gemm_mxfp8", "mxfp8", 300, 2880, 2880)  # upcast tiles
    _gemm("gemm_mxfp8", "mxfp8", 1024, 2880, 2880)  # upcast tiles, TMA
    _gemm("gemm_mxfp8", "mxfp8", 1024, 2880, 2880, backend="dequant-bf16")


# -- activation quantization, weight conversion


@scenario("group_quant", ("act_quant_fp8_block", "act_quant_mxfp8", "mxfp8_quantize"), ("_group_quant_kernel",))
def _():
    import torch

    from quantkit.formats.rounding import Rounding

    x = _randn(37, 2880)
    for sf in ("float", "ue8m0"):
        _call("act_quant_fp8_block", x, sf, "rceil")
    _call("act_quant_fp8_block", _randn(4096, 7168), "ue8m0", "rceil", scale_mn=True)  # DeepGEMM's MN-major scales
    _call("act_quant_mxfp8", x, "rceil")
    _call("act_quant_fp8_block", x, "ue8m0", "rceil", hw_cast=False)  # the assembled E4M3 byte, asked for explicitly
    _call("mxfp8_quantize", x, "rceil", hw_cast=False)
    _call("mxfp8_quantize", _randn(4, 2880, 2880, dtype=torch.float32), "floor",
          Rounding("stochastic", seed=11, name="w", offset=2**32 - 12345))  # fmt: skip


@scenario("fused_act_quant", ("rmsnorm_act_quant", "silu_mul_act_quant", "swiglu_act_quant"), ("_rmsnorm_quant_kernel", "_act_quant_kernel"))
def _():
    for fmt, sf in (("fp8-block", "float"), ("fp8-block", "ue8m0"), ("mxfp8", "float")):
        _call("rmsnorm_act_quant", _randn(5, 7168), _randn(7168), 1e-6, fmt, sf, "rceil")
        _call("silu_mul_act_quant", _randn(5, 2048), _randn(5, 2048), fmt, sf, "rceil")
        _call("swiglu_act_quant", _randn(5, 5760), fmt, sf, "rceil")


@scenario("fp8_block_quant", ("fp8_block_quantize_weight",), ("_fp8_block_quant_kernel",))
def _():
    from quantkit.formats.rounding import Rounding

    for sf in ("float", "ue8m0"):
        _call("fp8_block_quantize_weight", _randn(576, 7168), sf, "rceil")
    _call("fp8_block_quantize_weight", _randn(576, 7168), "float", "rceil", hw_cast=False)
    _call("fp8_block_quantize_weight", _randn(2, 300, 2880), "float", "rceil",
          Rounding("stochastic", seed=11, name="w", offset=2**32 - 12345))  # fmt: skip


@scenario("mxfp4_decode", ("mxfp4_decode",), ("_mxfp4_decode_kernel",))
def _():
    import torch

    blocks = torch.zeros(2, 64, 90, 16, dtype=torch.uint8)
    scales = torch.full((2, 64, 90), 127, dtype=torch.uint8)
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        _call("mxfp4_decode", blocks, scales, dtype)


@scenario("mla_decode", ("mla_decode",), ("_mla_split_kernel", "_decode_merge_kernel"))
def _():
    for b, ctx in ((1, 4000), (64, 50)):  # several KV splits and the merge; one split
        kv, k_rot, tables, lens = _paged(b, 1, 512, 64, [ctx] * b)  # one latent "head": kv [slots, 512], k_rot [slots, 64]
        _call("mla_decode", _randn(b, 128, 512), _randn(b, 128, 64), kv[:, 0], k_rot[:, 0], tables, lens, 16, 0.1)


@scenario("selftest_mismatched_branch", (), ("mismatched_branch_kernel",), into=SELFTESTS)
def _():
    from . import test_compile_sm90  # the kernel lives beside the test that expects its CompilationError

    test_compile_sm90.launch_mismatched_branch()
