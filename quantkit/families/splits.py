"""How EP/TP/DP serving splits a family's tensors: the rules a family declares (data; :mod:`quantkit.shard.rules`
matches and applies them).  Kinds, in the serving literature's terms (DeepSeek-V3 inference/convert.py for DeepSeek):

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

A rule's pattern is a regex over the module path (the tensor name without its parameter suffix).  The groups below
are the ones several families share.
"""

from __future__ import annotations

from dataclasses import dataclass

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


LAYER = r"model\.layers\.\d+\."  # a decoder layer's prefix, as patterns start
VOCAB = (Rule(r"model\.embed_tokens", "column"), Rule(r"lm_head", "column"))
NORMS = (Rule(LAYER + r"(input|post_attention)_layernorm", "replicate"), Rule(r"model\.norm", "replicate"))
QKVO = (
    Rule(LAYER + r"self_attn\.q_proj", "column", "heads"),
    Rule(LAYER + r"self_attn\.(k|v)_proj", "column", "kv_heads", kv=True),
    Rule(LAYER + r"self_attn\.o_proj", "row", "heads"),
)
DENSE_MLP = (Rule(LAYER + r"mlp\.(gate|up)_proj", "column"), Rule(LAYER + r"mlp\.down_proj", "row"))
