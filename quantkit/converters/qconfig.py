"""``quantization_config`` of each target, as the engines that read them expect it.

* ``fp8-block``: HF/DeepSeek fine-grained FP8 (transformers FineGrainedFP8Config, vLLM/SGLang ``fp8``):
  quant_method fp8, activation_scheme dynamic, fmt e4m3, weight_block_size [128, 128]; ``scale_fmt:
  ue8m0`` when the scales are powers of two (DeepSeek-V3.1); ``modules_to_not_convert`` lists the
  projections ``--ignore`` kept (absent when none, as in DeepSeek's and Qwen's releases).
* ``mxfp8``: compressed-tensors ``mxfp8-quantized`` (llm-compressor's MXFP8 scheme): weights 8-bit
  float, group 32, symmetric, static, uint8 (E8M0) scales; input activations the same but dynamic;
  ``ignore`` lists every Linear module left unquantized (routers, lm_head, MTP eh_proj, --ignore).
* ``mxfp4``: GPT-OSS as upstream ships it (``quant_method: mxfp4``, ``modules_to_not_convert``: attention,
  routers, embeddings, lm_head); other families compressed-tensors ``mxfp4-pack-quantized`` with
  weights 4-bit float, group 32, uint8 (E8M0) scales and no activation quantization (its MXFP4A16
  scheme: what the engine serves, weights dequantized, activations in BF16); ``ignore`` as for mxfp8.
* ``bf16``: none (the key is removed).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from .items import LINEAR, MODULE

if TYPE_CHECKING:
    from .plan import Task

QUANTIZED = ("fp8-block", "mxfp8", "mxfp4")
# GPT-OSS upstream (openai/gpt-oss-20b, -120b config.json)
GPT_OSS_MXFP4 = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                 "quant_method": "mxfp4"}


def _args(dynamic: bool, bits: int = 8) -> dict:
    return {
        "num_bits": bits, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
        "dynamic": dynamic, "scale_dtype": "torch.uint8", "zp_dtype": None, "actorder": None,
        "block_structure": None, "observer": None if dynamic else "memoryless_minmax", "observer_kwargs": {},
    }


def kept_linear(tasks: list["Task"]) -> list[str]:
    """Modules of the projections the family would quantize but that stay unquantized (--ignore)."""
    return [t.item.module for t in tasks if t.item.role == LINEAR and t.target not in QUANTIZED]


def unquantized_modules(tasks: list["Task"]) -> list[str]:
    """Every Linear module written unquantized: routers, heads, MTP projections, and --ignore'd ones."""
    return [t.item.module for t in tasks if t.item.role == MODULE] + kept_linear(tasks)


def quantization_config(to: str, scale_fmt: str | None, tasks: list["Task"]) -> dict | None:
    if to == "bf16":
        return None
    if to == "fp8-block":
        qc: dict = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
        if scale_fmt == "ue8m0":
            qc["scale_fmt"] = "ue8m0"
        if kept := kept_linear(tasks):
            qc["modules_to_not_convert"] = kept
        return qc
    if to == "mxfp4" and any(t.item.fused for t in tasks):
        qc = copy.deepcopy(GPT_OSS_MXFP4)
        qc["modules_to_not_convert"] += kept_linear(tasks)  # experts --ignore kept in BF16
        return qc
    fmt = f"{to}-quantized" if to == "mxfp8" else "mxfp4-pack-quantized"
    acts = _args(True) if to == "mxfp8" else None
    group = {"targets": ["Linear"], "format": fmt, "weights": _args(False, 8 if to == "mxfp8" else 4),
             "input_activations": acts, "output_activations": None}
    return {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "config_groups": {"group_0": group}, "ignore": unquantized_modules(tasks), "kv_cache_scheme": None,
        "sparsity_config": {}, "transform_config": {},
    }
