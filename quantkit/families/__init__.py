"""Model families: the one registry of them, one module each (:mod:`.gpt_oss`, :mod:`.deepseek_v3`, :mod:`.qwen3`).

A family module registers a :class:`Family` that says all quantkit needs to know about the family, or where it lives:

* ``architectures``: the config.json ``architectures`` that are this family; ``arch`` (:class:`Arch`): how its
  config.json reads beyond the shared core (:mod:`quantkit.modelconfig`) and which tensors it implies
  (:mod:`quantkit.modelshapes`);
* ``quantized``: which tensors (regexes over HF root names of weights) quantized targets quantize; ``fused_experts``;
* ``converter``: its conversion items' builder ``build(ckpt, model_config, where) -> [Item]`` (:mod:`quantkit.converters`);
* ``engine``: its engine model's builder ``build(model_config, weights) -> CausalLM`` (:mod:`quantkit.engine.models`);
* ``shard``: how EP/TP/DP serving splits each tensor (rules of :mod:`.splits`; :mod:`quantkit.shard` applies them);
* ``synth``: its synthetic checkpoint builder ``build(dims, seed, layout, scale_fmt) -> Synth`` (:mod:`quantkit.synth`)
  and ``presets``, the shapes it synthesizes (``tiny``, ``tiny-ragged``, the released models').

Code lives with its kind (converters/, engine/models/, synth/) and is named here as ``"module:attribute"``, imported
when first used (as the CLI names its commands), so reading a config imports no engine; a callable is taken as is.
What stays in source precision (DESIGN.md "What gets quantized"): embeddings, lm_head, routers, norms, sinks,
biases, DeepSeek's e_score_correction_bias and its MTP ``eh_proj`` / ``shared_head`` (BF16 upstream, loaded as
plain linears by vLLM and SGLang).
"""

from __future__ import annotations

from .registry import FAMILIES, SPARSE, Arch, Family, Ref, detect, get, is_quantized_weight, register, supported_architectures

from . import gpt_oss, deepseek_v3, qwen3  # noqa: E402, F401, I001  (each registers its family, in this order)

__all__ = ["FAMILIES", "SPARSE", "Arch", "Family", "Ref", "detect", "get", "is_quantized_weight", "register", "supported_architectures"]
