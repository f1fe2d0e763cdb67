"""``load(path, device, dtype)``: any source checkpoint or quantkit output -> a ready :class:`CausalLM`.

config.json names the family and the dimensions (:mod:`quantkit.modelconfig`, checked against the
tensors by :mod:`quantkit.modelshapes`); each weight's format is read off
its tensors (:mod:`.weights`); config.json's ``quantization_config`` and quantkit.json's options
say how activations are quantized at serve time (:class:`.weights.QuantScheme`).  With
``act_quant=False`` activations stay unquantized: the source model's numerics with weights
dequantized (what transformers computes when it dequantizes an FP8/MXFP4 checkpoint).

Every quantized linear, MoE and attention layer calls its ops through one
:class:`~quantkit.kernels.dispatch.Dispatcher`, ``model.ops``: ``backend="auto"`` runs the fastest
available backend per op (Triton / cuBLAS on CUDA; the torch references on a CPU, so CPU numerics
are the references'), ``backend="torch"`` the references everywhere (what eval compares against),
``per_op`` overrides single ops (e.g. ``{"fused_moe": "torch"}``); ``model.ops.ran`` names the
backend each op last ran on.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import families
from ..checkpoint import MANIFEST, Checkpoint, CheckpointError, load_json_object
from ..kernels.dispatch import AUTO, Dispatcher
from ..modelshapes import verify
from .model import CausalLM
from .weights import QuantScheme, Weights


def load(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    *,
    act_quant: bool = True,
    backend: str = AUTO,
    per_op: dict[str, str] | None = None,
    scale_mn: bool | None = None,
    rank_of_shard: bool = False,
) -> CausalLM:
    """Build the engine model of the checkpoint at ``path``; ``dtype`` is the activation/compute dtype;
    ``scale_mn``: fp8-block activation scales written MN-major (None: on CUDA devices; the values and
    the logits are the same either way).  ``rank_of_shard``: ``path`` is one rank directory of ``quantkit
    shard`` (its attention heads and vocabulary share where TP > 1) and the caller runs the other ranks and
    their collectives (:mod:`.parallel`); refused otherwise."""
    ckpt = Checkpoint(path)
    if ckpt.layout != "root":
        raise CheckpointError(f"{ckpt.root}: the engine reads the HF root layout, not GPT-OSS's original/ folder")
    shard = ckpt.config.get("quantkit_shard")
    if shard is not None and not rank_of_shard:  # one rank's part: routed experts and TP slices are missing, the model would be wrong
        raise CheckpointError(
            f"{ckpt.root}: rank {shard.get('rank')} of a {shard.get('world_size')}-rank checkpoint written by `quantkit shard` "
            f"(EP {shard.get('ep_size')}, TP {shard.get('tp_size')}); the engine runs whole checkpoints: load the one it was sharded from")
    mc = verify(ckpt)  # the config read once, checked against the tensors (a rank's: by their global shapes)
    if shard is not None:
        mc = mc.local(int(shard.get("tp_size", 1)))  # this rank's attention heads
    manifest_path = ckpt.root / MANIFEST
    manifest = load_json_object(manifest_path.read_bytes(), str(manifest_path), "the file") if manifest_path.exists() else {}
    ops = Dispatcher(backend, dict(per_op or {}))
    if scale_mn is None:
        scale_mn = torch.device(device).type == "cuda"
    scheme = QuantScheme.from_config(ckpt.config, manifest, act_quant, scale_mn)
    w = Weights(ckpt, device, dtype, scheme, ops)
    with torch.no_grad():
        model = families.get(mc.family).load("engine")(mc, w)  # the family's model file: build(mc, weights)
    w.check_all_used()
    model.ops = ops  # the dispatcher every layer calls: model.ops.ran names the backend of each op
    return model.eval()
