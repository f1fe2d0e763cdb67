"""One reading of a checkpoint's config.json into what quantkit needs: family, dimensions, experts,
layers, vocabulary.  inspect, convert, shard, eval and the engine (serve) all read it here, so they
accept and refuse the same configs; :mod:`quantkit.modelshapes` checks it against the tensors.

Keys: a setting is read under every name that transformers 4.x and 5.x (each config class with its
``attribute_map``) and the upstream repositories write for that family, e.g. Qwen3-MoE's expert
count is ``num_experts`` (4.x, Qwen's repositories) or ``num_local_experts`` (5.x).  Either is
accepted; both present and disagreeing is refused.  A key transformers does not map for a family
is not read for it (transformers would ignore it too).  The family's module (:mod:`quantkit.families`) lists
its keys and the rest of what sets it apart (:class:`~quantkit.families.Arch`: dense or MoE, which layers
are sparse, MLA, shared experts, grouped routing, defaults), so nothing here names a family.

Defaults for an absent key are the transformers config class defaults where every real
checkpoint may omit the key (head_dim, sparse-layer spacing); the dimensions a model cannot be
built without (hidden size, vocabulary, depth, heads, expert counts, MLA ranks) are required.
DeepSeek's ``num_nextn_predict_layers`` counts the MTP layers the checkpoint carries (0 when
absent): transformers' default of 1 concerns a layer it never builds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from . import families
from .checkpoint import CheckpointError

_REQUIRED = object()

# the config keys of a setting where a family's Arch.keys does not name its own (first: the canonical name); a
# family reads MTP layers only where it names their keys
DEFAULT_KEYS: dict[str, tuple[str, ...]] = {"experts": ("num_local_experts",), "top_k": ("num_experts_per_tok",)}


def _keys(setting: str, family: str) -> tuple[str, ...]:
    return dict(families.get(family).arch.keys).get(setting) or DEFAULT_KEYS[setting]


class _Keys(Mapping):
    """``KEYS[setting][family]``: the keys ``setting`` is read under for each family that names its own (its
    :class:`~quantkit.families.Arch` ``keys``), ``"*"`` the default; read from the families registry when asked."""

    def __init__(self, setting: str) -> None:
        self.setting = setting

    def _table(self) -> dict[str, tuple[str, ...]]:
        own = {f.name: k for f in families.FAMILIES.values() if (k := dict(f.arch.keys).get(self.setting))}
        return own | ({"*": DEFAULT_KEYS[self.setting]} if self.setting in DEFAULT_KEYS else {})

    def __getitem__(self, family: str) -> tuple[str, ...]:
        return self._table()[family]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


KEYS = {setting: _Keys(setting) for setting in ("experts", "top_k", "mtp_layers")}


@dataclass(frozen=True)
class Mla:
    """DeepSeek multi-head latent attention ranks and head dims."""

    q_lora: int | None  # None: q_proj straight from the hidden state
    kv_lora: int
    nope: int
    rope: int
    v: int


@dataclass(frozen=True)
class ModelConfig:
    family: str
    where: str  # the config file, for messages
    raw: dict  # config.json as read (every other setting: rope, eps, routing options ...)
    hidden: int
    vocab: int
    layers: int  # decoder layers (without DeepSeek's MTP layers)
    heads: int
    kv_heads: int
    head_dim: int  # GQA families; DeepSeek: qk_rope_head_dim (as transformers 5 sets it)
    intermediate: int  # dense MLP width; GPT-OSS: each expert's
    experts: int  # routed experts (0: dense model)
    top_k: int
    moe_intermediate: int  # each routed expert's width (GPT-OSS: intermediate)
    shared_experts: int
    mtp_layers: int
    sparse: tuple[bool, ...]  # per layer, MTP layers included: an MoE layer
    tied: bool
    attention_bias: bool
    mla: Mla | None = None

    @property
    def all_layers(self) -> int:
        return self.layers + self.mtp_layers

    def local(self, tp: int) -> ModelConfig:
        """As a rank of TP size ``tp`` builds its layers: heads / tp, KV heads / tp (one when tp exceeds
        them: replicated, as quantkit shard writes them); head_dim and everything else global."""
        if tp == 1:
            return self
        return replace(self, heads=self.heads // tp, kv_heads=max(1, self.kv_heads // tp))


class _Reader:
    def __init__(self, cfg: dict, where: str, family: str) -> None:
        self.cfg, self.where, self.family = cfg, where, family

    def fail(self, msg: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: {msg}")

    def value(self, keys: tuple[str, ...], default: object = _REQUIRED) -> object:
        """The setting under any of ``keys``; two keys with different values are refused."""
        found = [(k, self.cfg[k]) for k in keys if self.cfg.get(k) is not None]
        if len({repr(v) for _, v in found}) > 1:
            (k1, v1), (k2, v2) = found[:2]
            raise self.fail(f"{k1} = {v1!r} and {k2} = {v2!r} disagree (both name one setting; keep one)")
        if found:
            return found[0][1]
        if default is _REQUIRED:
            raise self.fail(f"{' / '.join(keys)} is missing; a {self.family} config needs it")
        return default

    def int(self, *keys: str, default: object = _REQUIRED, least: int = 1) -> int:
        v = self.value(keys, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise self.fail(f"{keys[0]} = {v!r} must be an integer >= {least}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.value((key,), default)
        if not isinstance(v, bool):
            raise self.fail(f"{key} = {v!r} must be true or false")
        return v

    def layer_list(self, key: str, n: int) -> list[int]:
        v = self.value((key,), [])
        if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in v):
            raise self.fail(f"{key} = {v!r} must be a list of layer indices in [0, {n})")
        return v


def _sparse(r: _Reader, arch: families.Arch, n: int, experts: int) -> tuple[bool, ...]:
    """Which layers are MoE, by the family's rule (transformers; DeepSeek's moe_layer_freq as upstream)."""
    if not arch.moe:
        return (False,) * n
    if arch.sparse == "step":  # Qwen3-MoE
        step, only = r.int("decoder_sparse_step", default=1), set(r.layer_list("mlp_only_layers", n))
        return tuple(experts > 0 and i not in only and (i + 1) % step == 0 for i in range(n))
    if arch.sparse == "first_dense":  # DeepSeek-V3
        dense, freq = r.int("first_k_dense_replace", default=3, least=0), r.int("moe_layer_freq", default=1)
        return tuple(experts > 0 and i >= dense and i % freq == 0 for i in range(n))
    return (True,) * n


def _mla(r: _Reader) -> Mla:
    if "q_lora_rank" not in r.cfg:
        raise r.fail(f"q_lora_rank is missing (null for no q LoRA); a {r.family} config needs it")
    q_lora = None if r.cfg["q_lora_rank"] is None else r.int("q_lora_rank")
    return Mla(q_lora, r.int("kv_lora_rank"), r.int("qk_nope_head_dim"), r.int("qk_rope_head_dim"), r.int("v_head_dim"))


def _check_routing(r: _Reader, experts: int, top_k: int, grouped: bool) -> None:
    if top_k > experts:
        raise r.fail(f"{_keys('top_k', r.family)[0]} = {top_k} exceeds the {experts} routed experts")
    if grouped:
        groups, pick = r.int("n_group", default=1), r.int("topk_group", default=1)
        if experts % groups or pick > groups or top_k > pick * (experts // groups):
            raise r.fail(f"grouped routing: n_group {groups} must divide the {experts} experts, topk_group {pick} <= n_group, "
                         f"and num_experts_per_tok {top_k} <= topk_group x experts per group")


def read(config: object, where: str = "config.json") -> ModelConfig:
    """config.json (a dict) -> :class:`ModelConfig`; a CheckpointError naming ``where`` and the rule otherwise."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: must be a JSON object, not {type(config).__name__}")
    try:
        family = families.detect(config, where)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    fam, a = family.name, family.arch
    r = _Reader(config, where, fam)
    hidden, heads, n = r.int("hidden_size"), r.int("num_attention_heads"), r.int("num_hidden_layers")
    experts = r.int(*_keys("experts", fam)) if a.moe else 0
    top_k = r.int(*_keys("top_k", fam)) if a.moe else 0
    mtp = r.int(*_keys("mtp_layers", fam), default=0, least=0) if "mtp_layers" in dict(a.keys) else 0
    sparse = _sparse(r, a, n + mtp, experts)
    mla = _mla(r) if a.mla else None
    kv_heads = heads if mla else r.int("num_key_value_heads", **({} if a.kv_heads_required else {"default": heads}))
    head_dim = mla.rope if mla else r.int("head_dim", default=a.head_dim or hidden // heads)
    if heads % kv_heads:
        raise r.fail(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if a.moe:
        _check_routing(r, experts, top_k, a.grouped_routing)
    # widths are required where a layer uses them (GPT-OSS experts use intermediate_size)
    inter = r.int("intermediate_size") if a.experts_use_intermediate or not all(sparse) else r.int("intermediate_size", default=0, least=0)
    moe_inter = inter if a.experts_use_intermediate else r.int("moe_intermediate_size") if any(sparse) else 0
    return ModelConfig(
        family=fam, where=where, raw=config, hidden=hidden, vocab=r.int("vocab_size"), layers=n, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, intermediate=inter, experts=experts, top_k=top_k, moe_intermediate=moe_inter,
        shared_experts=r.int("n_shared_experts", default=1, least=0) if a.shared_experts else 0, mtp_layers=mtp,
        sparse=sparse, tied=r.flag("tie_word_embeddings", False), attention_bias=r.flag("attention_bias", a.attention_bias), mla=mla,
    )
