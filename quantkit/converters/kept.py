"""Families whose names are kept exactly (Qwen3, Qwen3-MoE, DeepSeek-V3): the conversion items are the
tensors the config implies (:mod:`quantkit.modelshapes`), in checkpoint order, each checked by
:class:`~.items.Expect` for its shape and for the dtype its format needs.
"""

from __future__ import annotations

from ..checkpoint import Checkpoint
from ..families import FAMILIES
from ..modelconfig import ModelConfig
from ..modelshapes import decoder_layers, layer, top
from .items import Expect, Item


def expect(e: Expect, shapes: dict[str, tuple[int, ...]]) -> None:
    """Each tensor the config implies, in order: a 2-D one (but an embedding) is a Linear weight."""
    for name, shape in shapes.items():
        if len(shape) == 2 and not name.endswith("embed_tokens.weight"):
            e.linear(name, shape)
        else:
            e.tensor(name, shape)


def build(ckpt: Checkpoint, mc: ModelConfig, where: str) -> list[Item]:
    e = Expect(FAMILIES[mc.family], ckpt.tensors, mc.raw, where)
    head, tail = top(mc)
    expect(e, head)
    for i in range(decoder_layers(mc, ckpt.tensors)):  # DeepSeek's MTP layers when the checkpoint has them
        expect(e, layer(mc, i))
    if mc.tied and e.has("lm_head.weight"):  # a tied checkpoint may still hold its head
        tail["lm_head.weight"] = (mc.vocab, mc.hidden)
    expect(e, tail)
    return e.finish()
