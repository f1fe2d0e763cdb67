"""The tensors a config implies, by HF root name, and the check of a checkpoint's tensors against them.

Shapes are logical: a projection weight is [out, in] as BF16 and F8_E4M3 (fp8-block, mxfp8) store
it; GPT-OSS's fused experts ``mlp.experts.{gate_up,down}_proj`` are [E, out, in], stored as MXFP4
``_blocks`` [E, out, in/32, 16], as F8 [E, out, in], or as transformers' BF16 [E, in, out].  On a
rank directory of ``quantkit shard`` a tensor is compared by its global shape
(``quantkit_shard.splits``) and only the rank's routed experts are expected.  Scale tensors are
inspect's business (their shapes follow their weight's); tensors no entry names are the converters'
and the shard rules' (both refuse them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from . import families
from .checkpoint import Checkpoint, CheckpointError, TensorInfo
from .modelconfig import ModelConfig, read

Shapes = dict[str, tuple[int, ...]]
LAYER_RE = re.compile(r"model\.layers\.(\d+)\.")
FUSED = ("gate_up_proj", "down_proj")
# after a weight's name: FP8 / MXFP8 scales, GPT-OSS MXFP4 parts, compressed-tensors' packed MXFP4 (``weight_packed``)
SCALED = ("_scale_inv", "_scale", "_blocks", "_scales", "_packed")
ACT_SCALES = ("input_scale", "output_scale")  # compressed-tensors' static activation scales of a Linear module
MAX_LISTED = 8  # problems listed one by one; the rest are counted


def mlp(prefix: str, inter: int, hidden: int) -> Shapes:
    return {f"{prefix}gate_proj.weight": (inter, hidden), f"{prefix}up_proj.weight": (inter, hidden), f"{prefix}down_proj.weight": (hidden, inter)}


def gqa_attention(mc: ModelConfig, p: str) -> Shapes:
    """Qwen3 / GPT-OSS attention (q/k/v/o with their biases when attention_bias; Qwen's q/k norms, GPT-OSS's sinks)."""
    q, kv = mc.heads * mc.head_dim, mc.kv_heads * mc.head_dim
    out: Shapes = {f"{p}input_layernorm.weight": (mc.hidden,)}
    for n, rows, cols in (("q", q, mc.hidden), ("k", kv, mc.hidden), ("v", kv, mc.hidden), ("o", mc.hidden, q)):
        out[f"{p}self_attn.{n}_proj.weight"] = (rows, cols)
        if mc.attention_bias:
            out[f"{p}self_attn.{n}_proj.bias"] = (rows,)
    if families.get(mc.family).arch.sinks:
        out[f"{p}self_attn.sinks"] = (mc.heads,)
    else:
        out |= {f"{p}self_attn.q_norm.weight": (mc.head_dim,), f"{p}self_attn.k_norm.weight": (mc.head_dim,)}
    return out | {f"{p}post_attention_layernorm.weight": (mc.hidden,)}


def mla_attention(mc: ModelConfig, p: str) -> Shapes:
    m, a = mc.mla, f"{p}self_attn."
    assert m is not None
    qh = mc.heads * (m.nope + m.rope)
    out: Shapes = {f"{p}input_layernorm.weight": (mc.hidden,)}
    if m.q_lora:
        out |= {a + "q_a_proj.weight": (m.q_lora, mc.hidden), a + "q_a_layernorm.weight": (m.q_lora,), a + "q_b_proj.weight": (qh, m.q_lora)}
    else:
        out[a + "q_proj.weight"] = (qh, mc.hidden)
    out |= {a + "kv_a_proj_with_mqa.weight": (m.kv_lora + m.rope, mc.hidden), a + "kv_a_layernorm.weight": (m.kv_lora,),
            a + "kv_b_proj.weight": (mc.heads * (m.nope + m.v), m.kv_lora), a + "o_proj.weight": (mc.hidden, mc.heads * m.v)}
    return out | {f"{p}post_attention_layernorm.weight": (mc.hidden,)}


def moe(mc: ModelConfig, p: str, expert_ids: list[int]) -> Shapes:
    """The MoE block of a layer: router, routed experts (those in ``expert_ids``), shared experts."""
    E, H = mc.experts, mc.hidden
    m, fam = f"{p}mlp.", families.get(mc.family)
    if fam.fused_experts:  # GPT-OSS: the fused weights are logical [E, out, in] entries, checked by fused_shape
        return {m + "router.weight": (E, H), m + "router.bias": (E,), m + "experts.gate_up_proj": (E, 2 * mc.intermediate, H),
                m + "experts.gate_up_proj_bias": (E, 2 * mc.intermediate), m + "experts.down_proj": (E, H, mc.intermediate),
                m + "experts.down_proj_bias": (E, H)}
    out: Shapes = {m + "gate.weight": (E, H)}
    if fam.arch.grouped_routing and mc.raw.get("topk_method", "noaux_tc") == "noaux_tc":
        out[m + "gate.e_score_correction_bias"] = (E,)
    for e in expert_ids:
        out |= mlp(f"{m}experts.{e}.", mc.moe_intermediate, H)
    if mc.shared_experts:
        out |= mlp(m + "shared_experts.", mc.moe_intermediate * mc.shared_experts, H)
    return out


def layer(mc: ModelConfig, i: int, expert_ids: list[int] | None = None) -> Shapes:
    """Every tensor of decoder layer ``i`` (an MTP layer's extra tensors included), in checkpoint order."""
    p = f"model.layers.{i}."
    mtp = i >= mc.layers
    out: Shapes = {}
    if mtp:
        out |= {p + "embed_tokens.weight": (mc.vocab, mc.hidden), p + "enorm.weight": (mc.hidden,), p + "hnorm.weight": (mc.hidden,),
                p + "eh_proj.weight": (mc.hidden, 2 * mc.hidden)}
    out |= mla_attention(mc, p) if mc.mla else gqa_attention(mc, p)
    if mc.sparse[i]:
        out |= moe(mc, p, list(range(mc.experts)) if expert_ids is None else expert_ids)
    else:
        out |= mlp(p + "mlp.", mc.intermediate, mc.hidden)
    if mtp:
        out |= {p + "shared_head.norm.weight": (mc.hidden,), p + "shared_head.head.weight": (mc.vocab, mc.hidden)}
    return out


def top(mc: ModelConfig) -> tuple[Shapes, Shapes]:
    """(tensors before the layers, after them); lm_head only when not tied (a tied checkpoint may still hold it)."""
    tail: Shapes = {"model.norm.weight": (mc.hidden,)}
    if not mc.tied:
        tail["lm_head.weight"] = (mc.vocab, mc.hidden)
    return {"model.embed_tokens.weight": (mc.vocab, mc.hidden)}, tail


def fused_shape(tensors: dict[str, TensorInfo], base: str, shape_of) -> tuple[int, ...] | None:
    """Logical [E, out, in] of a GPT-OSS fused expert weight in whichever form it is stored (None: absent)."""
    if base + "_blocks" in tensors:
        *lead, g, b = shape_of(base + "_blocks")
        return (*lead, g * b * 2)  # two E2M1 values a byte
    if base not in tensors:
        return None
    s = shape_of(base)
    return s if tensors[base].dtype == "F8_E4M3" else (*s[:-2], s[-1], s[-2])  # BF16: transformers' [E, in, out]


def decoder_layers(mc: ModelConfig, tensors: dict[str, TensorInfo]) -> int:
    """Layers the checkpoint carries: with DeepSeek's MTP layers, or without them (transformers drops
    them on load, so a checkpoint it saved has none while its config still counts them)."""
    return mc.all_layers if any(n.startswith(f"model.layers.{mc.layers}.") for n in tensors) else mc.layers


def stored_shape(tensors: dict[str, TensorInfo], name: str, shape_of) -> tuple[int, ...] | None:
    """Logical shape of an expected tensor as stored (None: absent); compressed-tensors' MXFP4 keeps
    ``<module>.weight_packed`` [N, K/2] (two E2M1 values a byte) in place of ``weight``."""
    if name.endswith(FUSED):
        return fused_shape(tensors, name, shape_of)
    if name in tensors:
        return shape_of(name)
    if name.endswith(".weight") and name + "_packed" in tensors:
        *lead, half = shape_of(name + "_packed")
        return (*lead, half * 2)
    return None


def _expected(mc: ModelConfig, shard: dict | None, n_layers: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    head, tail = top(mc)
    yield from head.items()
    for i in range(n_layers):
        ids = None if shard is None or not mc.sparse[i] else list(shard.get("experts", {}).get(str(i), []))
        yield from layer(mc, i, ids).items()
    yield from tail.items()


def problems(mc: ModelConfig, ckpt: Checkpoint) -> list[str]:
    """What in ``ckpt``'s tensors disagrees with its config (HF names; OpenAI's original/ names, in that
    folder or opened alone, are the GPT-OSS converter's to check)."""
    if ckpt.layout != "root" or "embedding.weight" in ckpt.tensors:
        return []
    tensors, shard = ckpt.tensors, mc.raw.get("quantkit_shard")
    splits = shard.get("splits", {}) if isinstance(shard, dict) else {}

    def shape_of(name: str) -> tuple[int, ...]:
        return tuple(splits.get(name, {}).get("global_shape") or tensors[name].shape)

    present = {int(m.group(1)) for n in tensors if (m := LAYER_RE.match(n))}
    n_layers = decoder_layers(mc, tensors)
    out = []
    if present != set(range(n_layers)):
        mtp = f" (+ {mc.mtp_layers} MTP, num_nextn_predict_layers)" if mc.mtp_layers else ""
        out.append(f"layers {_span(present)} in the tensors, but the config says {mc.layers} (num_hidden_layers){mtp}")
    expected = dict(_expected(mc, shard, n_layers))
    for name, want in expected.items():
        got = stored_shape(tensors, name, shape_of)
        if got is None and _layer_of(name) in present | {None}:  # a whole layer missing is reported once, above
            out.append(f"tensor {name!r} is missing; the config implies {list(want)}")
        elif got is not None and got != want:
            out.append(f"tensor {name!r} has shape {list(got)}; the config implies {list(want)}")
    extra = [n for n in tensors if (_layer_of(n) or 0) < n_layers and not _accounted(n, expected, mc)]
    return out + [f"tensor {n!r} is not one the config implies for {mc.family}" for n in extra]


def _layer_of(name: str) -> int | None:
    m = LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def _accounted(name: str, expected: Shapes, mc: ModelConfig) -> bool:
    """An expected tensor, a scale or packed form of one (``_scale_inv``, ``_scale``, MXFP4 ``_blocks``/``_scales``), or a tied head."""
    if name in expected or (name == "lm_head.weight" and mc.tied):
        return True
    module, _, param = name.rpartition(".")
    return any(name.endswith(s) and name[: -len(s)] in expected for s in SCALED) or (param in ACT_SCALES and module + ".weight" in expected)


def _span(layers: set[int]) -> str:
    return f"0..{max(layers)} ({len(layers)})" if layers == set(range(len(layers))) and layers else str(sorted(layers)[:8]) if layers else "none"


def summarize(found: list[str], limit: int = MAX_LISTED) -> list[str]:
    return found[:limit] + ([f"... and {len(found) - limit} more disagreements with the config"] if len(found) > limit else [])


def verify(ckpt: Checkpoint, config: dict | None = None) -> ModelConfig:
    """The checkpoint's :class:`ModelConfig`, its tensors checked against it: one error naming the config and the first disagreement."""
    where = str(ckpt.root / "config.json")
    mc = read(ckpt.config if config is None else config, where)
    found = problems(mc, ckpt)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise CheckpointError(f"{where} disagrees with the tensors: {found[0]}{more}")
    return mc
