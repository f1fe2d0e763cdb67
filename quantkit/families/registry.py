"""The one registry of model families and what a family declares (:class:`Family`, :class:`Arch`); the package
docstring (:mod:`quantkit.families`) says what each field is for."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .splits import Rule

SPARSE = ("all", "step", "first_dense")


@dataclass(frozen=True)
class Arch:
    """A family's config.json and tensors beyond the shared Llama-style core (GQA attention with q/k norms, SwiGLU MLP)."""

    keys: tuple[tuple[str, tuple[str, ...]], ...] = ()  # setting -> the config keys it is read under (first: canonical)
    moe: bool = True  # routed experts (False: a dense family; no expert setting is read)
    sparse: str = "all"  # MoE layers: all; step (decoder_sparse_step, mlp_only_layers); first_dense (first_k_dense_replace, moe_layer_freq)
    head_dim: int | None = None  # head_dim when config.json omits it (None: hidden // heads)
    kv_heads_required: bool = False  # num_key_value_heads must be given (else it defaults to the heads)
    attention_bias: bool = False  # attention_bias when config.json omits it
    experts_use_intermediate: bool = False  # routed experts' width is intermediate_size (GPT-OSS), not moe_intermediate_size
    mla: bool = False  # DeepSeek multi-head latent attention (q/kv LoRA ranks)
    shared_experts: bool = False  # n_shared_experts always-on experts (default 1)
    grouped_routing: bool = False  # n_group / topk_group routing, with e_score_correction_bias under topk_method noaux_tc
    sinks: bool = False  # one attention sink logit per head instead of q/k norms

    def __post_init__(self) -> None:
        if self.sparse not in SPARSE:
            raise ValueError(f"sparse rule must be one of {SPARSE}, not {self.sparse!r}")


Ref = str | Callable[..., Any]  # "module:attribute", imported when first used, or the object itself


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    quantized: tuple[str, ...]  # regexes over HF root names of *weights* that quantized formats quantize
    fused_experts: bool  # routed experts fused [E, ...] (GPT-OSS), else per expert (DeepSeek, Qwen)
    arch: Arch
    converter: Ref
    engine: Ref
    shard: tuple[Rule, ...]
    synth: Ref
    presets: dict[str, dict] = field(default_factory=dict, compare=False)  # preset -> synth dimensions

    def load(self, part: str) -> Any:
        """``converter``, ``engine`` or ``synth``: the object itself (imported now when named as "module:attribute")."""
        ref = getattr(self, part)
        if callable(ref):
            return ref
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)


FAMILIES: dict[str, Family] = {}


def register(f: Family) -> Family:
    if f.name in FAMILIES:
        raise ValueError(f"family {f.name!r} registered twice")
    taken = {a for g in FAMILIES.values() for a in g.architectures} & set(f.architectures)
    if taken:
        raise ValueError(f"family {f.name!r}: architectures {sorted(taken)} belong to another family")
    FAMILIES[f.name] = f
    return f


def get(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}") from None


def supported_architectures() -> list[str]:
    return sorted(a for f in FAMILIES.values() for a in f.architectures)


def detect(config: dict, where: str = "config.json") -> Family:
    """The family named by ``config['architectures']``; a clear error otherwise."""
    archs = config.get("architectures") or []
    for f in FAMILIES.values():
        if any(a in f.architectures for a in archs):
            return f
    raise ValueError(
        f"{where}: architectures {archs or 'missing'} is not supported; supported: {', '.join(supported_architectures())}"
    )


def is_quantized_weight(family: Family, name: str) -> bool:
    """True for a linear projection weight (root name, without scale suffixes) that targets quantize."""
    return any(re.fullmatch(p, name) for p in family.quantized)
