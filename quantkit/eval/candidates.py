"""The candidate runner: the bundled engine (``quantkit.engine``) on a checkpoint, serving numerics.

The engine's pure-torch path is the serving spec: weights stay in their checkpoint format,
activations are quantized dynamically where the format says so, products are float32.  Its
``CausalLM.forward(input_ids [T], collect=list)`` returns float32 logits [T, V] and appends the
embeddings and then each decoder layer's output (before the final norm) to the list: the same
L+1 points as :mod:`quantkit.eval.reference` (hidden[0] embeddings, hidden[i] output of layer i-1).
Also serves as ``--impl engine`` (the engine on the source as the reference).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .reference import Forward

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class EngineRunner:
    """The engine on ``path``.  ``act_quant``: quantize activations as the checkpoint's format
    serves them (candidates); False keeps them unquantized, the source model's numerics with
    dequantized weights (``--impl engine`` as the reference, like transformers' dequantizing load)."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: str = "float32", act_quant: bool = True) -> None:
        from ..engine import load

        if dtype not in DTYPES:
            raise ValueError(f"engine dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        self.path = Path(path)
        # the ops' torch reference backends on every device: accuracy is measured on the reference
        # numerics, not on whichever GPU kernel the dispatcher would pick
        self.model = load(self.path, device=device, dtype=DTYPES[dtype], act_quant=act_quant, backend="torch")
        self.device = torch.device(device)
        acts = "dynamic activation quantization" if act_quant else "unquantized activations"
        self.label = f"quantkit engine (pure-torch path), {dtype}, {acts}, {device}"

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> Forward:
        hidden: list[torch.Tensor] = []
        logits = self.model(tokens.to(self.device), collect=hidden)
        return Forward(logits.float(), [h.float() for h in hidden])
