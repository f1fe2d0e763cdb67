"""Engine model files, one per family (each only wires shared layers); the registry maps a
:mod:`quantkit.families` name to its builder ``build(model_config, weights) -> CausalLM`` (:class:`quantkit.modelconfig.ModelConfig`)."""

from __future__ import annotations

from collections.abc import Callable

from ...modelconfig import ModelConfig
from ..model import CausalLM
from ..weights import Weights
from . import deepseek_v3, gpt_oss, qwen3

MODELS: dict[str, Callable[[ModelConfig, Weights], CausalLM]] = {
    "gpt-oss": gpt_oss.build,
    "deepseek-v3": deepseek_v3.build,
    "qwen3": qwen3.build,
    "qwen3-moe": qwen3.build,
}
