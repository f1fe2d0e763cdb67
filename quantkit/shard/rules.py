"""Split tables: for every tensor of a family, how EP/TP/DP serving splits it (data, one table per family).

Kinds (the serving literature's terms; DeepSeek-V3 inference/convert.py for DeepSeek):

* ``replicate``  every rank holds the whole tensor (norms, routers, MLA's q_a / kv_a, sinks' biases...).
* ``column``     column-parallel: output rows (dim 0) split over TP ranks; a bias or per-head
                 vector splits with them; q/k/v split by heads (``units``), KV heads replicated
                 when TP exceeds them (``kv``: rank t holds KV head t // (tp / n_kv)).
* ``row``        row-parallel: input columns (last dim) split over TP ranks; its bias is replicated
                 (added once after the all-reduce).
* ``expert``     one routed expert (per-expert names ``mlp.experts.<e>.``): whole, on the one EP rank
                 that owns expert e of that layer; never TP-split (EP = DP x TP).
* ``fused``      GPT-OSS fused experts [E, ...]: dim 0 sliced per EP rank (local order = ascending
                 global id; the global ids are recorded in the rank's config).  Never TP-split, so
                 gate_up's interleave (gate/up alternate rows) is never cut.

Quantization scales follow their weight (see :mod:`quantkit.shard.geometry`).  Rules match the
HF root tensor name with its parameter suffix (``weight``, ``bias``, ``weight_scale_inv``,
``weight_scale``, GPT-OSS ``_blocks`` / ``_scales`` / ``_bias`` / ``_scale_inv`` / ``_scale``);
a tensor that no rule matches is an error, never silently replicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .layout import ShardError

KINDS = ("replicate", "column", "row", "expert", "fused")


@dataclass(frozen=True)
class Rule:
    pattern: str  # regex over the module path (the name without its parameter suffix)
    kind: str
    units: str | None = None  # ModelConfig field counting the heads along the split dim (None: plain rows/cols)
    kv: bool = False  # KV heads: replicated when TP exceeds them

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"rule {self.pattern!r}: unknown kind {self.kind!r}")


@dataclass(frozen=True)
class Table:
    family: str
    rules: tuple[Rule, ...]


# parameter suffixes of a module (none: GPT-OSS sinks); the fused-expert pattern carries its own
PARAMS = r"(\.weight|\.bias|\.weight_scale_inv|\.weight_scale|\.e_score_correction_bias)?"
FUSED_PARAMS = r"(_blocks|_scales|_bias|_scale_inv|_scale)?"
_L = r"model\.layers\.\d+\."

_VOCAB = (Rule(r"model\.embed_tokens", "column"), Rule(r"lm_head", "column"))
_NORMS = (Rule(_L + r"(input|post_attention)_layernorm", "replicate"), Rule(r"model\.norm", "replicate"))
_QKVO = (
    Rule(_L + r"self_attn\.q_proj", "column", "heads"),
    Rule(_L + r"self_attn\.(k|v)_proj", "column", "kv_heads", kv=True),
    Rule(_L + r"self_attn\.o_proj", "row", "heads"),
)
_DENSE_MLP = (Rule(_L + r"mlp\.(gate|up)_proj", "column"), Rule(_L + r"mlp\.down_proj", "row"))

TABLES: dict[str, Table] = {}


def register(t: Table) -> Table:
    TABLES[t.family] = t
    return t


register(Table("gpt-oss", (
    *_VOCAB, *_NORMS, *_QKVO,
    Rule(_L + r"self_attn\.sinks", "column", "heads"),  # one sink logit per q head
    Rule(_L + r"mlp\.router", "replicate"),
    Rule(_L + r"mlp\.experts\.(gate_up|down)_proj", "fused"),
)))

# DeepSeek-V3 inference/convert.py: embed/head/wq/wq_b/wkv_b/w1/w3 dim 0, wo/w2 dim 1, the rest
# (wq_a, wkv_a, their norms, the router and its bias) replicated; experts given contiguously.
register(Table("deepseek-v3", (
    *_VOCAB, *_NORMS,
    Rule(_L + r"self_attn\.(q_proj|q_b_proj|kv_b_proj)", "column", "heads"),
    Rule(_L + r"self_attn\.(q_a_proj|kv_a_proj_with_mqa|q_a_layernorm|kv_a_layernorm)", "replicate"),
    Rule(_L + r"self_attn\.o_proj", "row", "heads"),
    Rule(_L + r"mlp\.gate", "replicate"),  # router weight and e_score_correction_bias
    Rule(_L + r"mlp\.experts\.\d+\.(gate|up|down)_proj", "expert"),
    Rule(_L + r"mlp\.shared_experts\.(gate|up)_proj", "column"),
    Rule(_L + r"mlp\.shared_experts\.down_proj", "row"),
    *_DENSE_MLP,
    # MTP layer (model.layers.61): its embedding and head split like embed_tokens / lm_head
    Rule(_L + r"(enorm|hnorm|eh_proj|shared_head\.norm)", "replicate"),
    Rule(_L + r"(embed_tokens|shared_head\.head)", "column"),
)))

_QWEN = (
    *_VOCAB, *_NORMS, *_QKVO,
    Rule(_L + r"self_attn\.(q|k)_norm", "replicate"),
    Rule(_L + r"mlp\.gate", "replicate"),  # the MoE router (no bias); gate_proj is the dense MLP
    Rule(_L + r"mlp\.experts\.\d+\.(gate|up|down)_proj", "expert"),
    *_DENSE_MLP,
)
register(Table("qwen3", _QWEN))
register(Table("qwen3-moe", _QWEN))

LAYER_RE = re.compile(r"model\.layers\.(\d+)\.")
EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.")


def table(family: str) -> Table:
    try:
        return TABLES[family]
    except KeyError:
        raise ShardError(f"no shard table for family {family!r}; known: {', '.join(TABLES)}") from None


def match(t: Table, name: str) -> tuple[Rule, str]:
    """(rule, parameter suffix) for tensor ``name``; an error naming the tensor when none applies."""
    for r in t.rules:
        params = FUSED_PARAMS if r.kind == "fused" else PARAMS
        m = re.fullmatch(f"(?:{r.pattern})(?P<param>{params})", name)
        if m:
            return r, m.group("param").lstrip(".")
    raise ShardError(f"tensor {name!r}: no {t.family} shard rule covers it (unknown tensor for this family)")
