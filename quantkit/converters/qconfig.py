"""``quantization_config`` of each target, as the engines that read them expect it: the target format's
:meth:`~quantkit.formats.Format.qconfig` (``fp8-block``: HF/DeepSeek fine-grained FP8; ``mxfp8``: compressed-tensors
``mxfp8-quantized``; ``mxfp4``: GPT-OSS's own, or compressed-tensors ``mxfp4-pack-quantized``; ``bf16``: none, the
key is removed), given the projections ``--ignore`` kept and every Linear module left unquantized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import formats
from .items import LINEAR, MODULE

if TYPE_CHECKING:
    from .plan import Task

PLAIN = ("bf16", "keep")  # task targets that quantize nothing


def kept_linear(tasks: list["Task"]) -> list[str]:
    """Modules of the projections the family would quantize but that stay unquantized (--ignore)."""
    return [t.item.module for t in tasks if t.item.role == LINEAR and t.target in PLAIN]


def unquantized_modules(tasks: list["Task"]) -> list[str]:
    """Every Linear module written unquantized: routers, heads, MTP projections, and --ignore'd ones."""
    return [t.item.module for t in tasks if t.item.role == MODULE] + kept_linear(tasks)


def quantization_config(to: str, scale_fmt: str | None, tasks: list["Task"]) -> dict | None:
    return formats.get(to).qconfig(scale_fmt, kept_linear(tasks), unquantized_modules(tasks), any(t.item.fused for t in tasks))
