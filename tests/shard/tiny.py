"""Tiny hand-built checkpoints in the REFERENCE.md layouts, for shard tests (random bytes: shard copies bytes).

``build(family, fmt, dst)``: fmt "source" is the family's shipped format (GPT-OSS: MXFP4 experts,
BF16 rest; DeepSeek: FP8-block; Qwen: BF16); "fp8-block", "mxfp8", "bf16" are the convert targets
as DESIGN.md names their tensors.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from quantkit.writer import CheckpointWriter, TensorSpec, plan_shards

H, HEADS, KV, HD, E, VOCAB = 256, 4, 2, 64, 8, 512
BF16, F32, U8, F8 = torch.bfloat16, torch.float32, torch.uint8, torch.float8_e4m3fn


def _rand(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    n = math.prod(shape) * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def linear(name: str, out: int, inp: int, fmt: str) -> dict[str, tuple]:
    if fmt == "fp8-block":
        return {f"{name}.weight": (F8, (out, inp)), f"{name}.weight_scale_inv": (F32, (-(-out // 128), -(-inp // 128)))}
    if fmt == "mxfp8":
        return {f"{name}.weight": (F8, (out, inp)), f"{name}.weight_scale": (U8, (out, inp // 32))}
    return {f"{name}.weight": (BF16, (out, inp))}


def fused(prefix: str, out: int, inp: int, fmt: str, proj: str) -> dict[str, tuple]:
    """GPT-OSS fused experts: [E, out, in] weights in every format but bf16 ([E, in, out])."""
    p = f"{prefix}.{proj}"
    t = {f"{p}_bias": (BF16, (E, out))}
    if fmt == "source":
        t |= {f"{p}_blocks": (U8, (E, out, inp // 32, 16)), f"{p}_scales": (U8, (E, out, inp // 32))}
    elif fmt == "fp8-block":
        t |= {p: (F8, (E, out, inp)), f"{p}_scale_inv": (F32, (E, -(-out // 128), -(-inp // 128)))}
    elif fmt == "mxfp8":
        t |= {p: (F8, (E, out, inp)), f"{p}_scale": (U8, (E, out, inp // 32))}
    else:
        t |= {p: (BF16, (E, inp, out))}
    return t


def _attn(p: str, fmt: str, hd: int, bias: bool) -> dict[str, tuple]:
    q_rows, kv_rows = HEADS * hd, KV * hd
    t = linear(f"{p}.q_proj", q_rows, H, fmt) | linear(f"{p}.k_proj", kv_rows, H, fmt)
    t |= linear(f"{p}.v_proj", kv_rows, H, fmt) | linear(f"{p}.o_proj", H, q_rows, fmt)
    if bias:
        t |= {f"{p}.{x}_proj.bias": (BF16, (r,)) for x, r in (("q", q_rows), ("k", kv_rows), ("v", kv_rows), ("o", H))}
    return t


def _mlp(p: str, inter: int, fmt: str) -> dict[str, tuple]:
    return linear(f"{p}.gate_proj", inter, H, fmt) | linear(f"{p}.up_proj", inter, H, fmt) | linear(f"{p}.down_proj", H, inter, fmt)


def _common(n_layers: int) -> dict[str, tuple]:
    t = {"model.embed_tokens.weight": (BF16, (VOCAB, H)), "lm_head.weight": (BF16, (VOCAB, H)), "model.norm.weight": (BF16, (H,))}
    for i in range(n_layers):
        t |= {f"model.layers.{i}.{n}.weight": (BF16, (H,)) for n in ("input_layernorm", "post_attention_layernorm")}
    return t


def gpt_oss(fmt: str) -> tuple[dict, dict]:
    lin = "bf16" if fmt == "source" else fmt
    t = _common(2)
    for i in range(2):
        p = f"model.layers.{i}"
        t |= _attn(f"{p}.self_attn", lin, HD, bias=True) | {f"{p}.self_attn.sinks": (BF16, (HEADS,))}
        t |= {f"{p}.mlp.router.weight": (BF16, (E, H)), f"{p}.mlp.router.bias": (BF16, (E,))}
        t |= fused(f"{p}.mlp.experts", 2 * H, H, fmt, "gate_up_proj") | fused(f"{p}.mlp.experts", H, H, fmt, "down_proj")
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": H, "num_hidden_layers": 2,
           "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD, "num_local_experts": E,
           "num_experts_per_tok": 4, "intermediate_size": H, "vocab_size": VOCAB}
    return t, cfg


def deepseek(fmt: str) -> tuple[dict, dict]:
    lin = "fp8-block" if fmt == "source" else fmt
    t = _common(3)
    nope, rope, v, q_lora, kv_lora = 64, 64, 128, 128, 128
    for i in range(3):  # layer 0 dense, 1 MoE, 2 the MTP layer (num_hidden_layers = 2)
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        t |= linear(f"{a}.q_a_proj", q_lora, H, lin) | linear(f"{a}.q_b_proj", HEADS * (nope + rope), q_lora, lin)
        t |= linear(f"{a}.kv_a_proj_with_mqa", kv_lora + rope, H, lin) | linear(f"{a}.kv_b_proj", HEADS * (nope + v), kv_lora, lin)
        t |= linear(f"{a}.o_proj", H, HEADS * v, lin) | {f"{a}.q_a_layernorm.weight": (BF16, (q_lora,)), f"{a}.kv_a_layernorm.weight": (BF16, (kv_lora,))}
        if i == 0:
            t |= _mlp(m, 512, lin)
            continue
        t |= {f"{m}.gate.weight": (BF16, (E, H)), f"{m}.gate.e_score_correction_bias": (F32, (E,))}
        t |= _mlp(f"{m}.shared_experts", 256, lin)  # two shared experts of 128: 128-tile aligned at TP 2
        for e in range(E):
            t |= _mlp(f"{m}.experts.{e}", 128, lin)
    mtp = "model.layers.2"
    t |= {f"{mtp}.{n}.weight": (BF16, (H,)) for n in ("enorm", "hnorm", "shared_head.norm")}
    t |= {f"{mtp}.eh_proj.weight": (BF16, (H, 2 * H)), f"{mtp}.embed_tokens.weight": (BF16, (VOCAB, H)), f"{mtp}.shared_head.head.weight": (BF16, (VOCAB, H))}
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": H, "num_hidden_layers": 2,
           "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "n_routed_experts": E, "n_shared_experts": 2,
           "num_experts_per_tok": 2, "intermediate_size": 512, "moe_intermediate_size": 128, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora,
           "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": v, "vocab_size": VOCAB}
    return t, cfg


def qwen(fmt: str, moe: bool) -> tuple[dict, dict]:
    lin = "bf16" if fmt == "source" else fmt
    t = _common(2)
    hd = 128 if moe else HD  # Qwen3-MoE: q wider than hidden
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        t |= _attn(a, lin, hd, bias=False) | {f"{a}.{n}.weight": (BF16, (hd,)) for n in ("q_norm", "k_norm")}
        if moe:
            t |= {f"{m}.gate.weight": (BF16, (E, H))}
            for e in range(E):
                t |= _mlp(f"{m}.experts.{e}", 128, lin)
        else:
            t |= _mlp(m, 512, lin)
    cfg = {"architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"], "hidden_size": H, "num_hidden_layers": 2,
           "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": hd, "vocab_size": VOCAB}
    if moe:
        cfg |= {"num_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
    else:
        cfg |= {"intermediate_size": 512}
    return t, cfg


FAMILIES = {"gpt-oss": gpt_oss, "deepseek-v3": deepseek, "qwen3": lambda f: qwen(f, False), "qwen3-moe": lambda f: qwen(f, True)}


def build(family: str, fmt: str, dst: Path, seed: int = 0, max_shard_size: int = 300_000) -> Path:
    """Write the tiny checkpoint (several safetensors files + index + config + a side file) to ``dst``."""
    layout, cfg = FAMILIES[family](fmt)
    g = torch.Generator().manual_seed(seed)
    w = CheckpointWriter(dst)
    plans = plan_shards([TensorSpec(n, d, s) for n, (d, s) in layout.items()], max_shard_size)
    for p in plans:
        w.write(p, iter([_rand(s.shape, s.dtype, g) for s in p.specs]))
    (w.tmp / "tokenizer_config.json").write_text('{"model_max_length": 128}\n')
    w.finish(plans, cfg, {"command": "test-build"})
    return dst


def write(dst: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """An ad-hoc checkpoint of exactly ``tensors`` (one file) with ``config``."""
    plans = plan_shards([TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()], 1 << 30)
    w = CheckpointWriter(dst)
    w.write(plans[0], iter(tensors.values()))
    w.finish(plans, config, {"command": "test-build"})
    return dst


def sparse(dst: Path, plans: list, config: dict) -> Path:
    """A checkpoint of real headers and sparse (unwritten, all-zero) data: full-size layouts at no disk cost."""
    import json

    dst.mkdir(parents=True)
    for p in plans:
        head = p.header()
        with open(dst / p.file, "wb") as f:
            f.write(head)
            f.truncate(len(head) + p.nbytes)
    index = {"metadata": {"total_size": sum(p.nbytes for p in plans)}, "weight_map": {s.name: p.file for p in plans for s in p.specs}}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    (dst / "config.json").write_text(json.dumps(config))
    return dst
