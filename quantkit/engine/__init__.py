"""The bundled inference engine: shared layers (``layers/``), one model file per family
(``models/``), packed quantized weights computed through :func:`qlinear.linear`, a paged KV cache
and the flat-token :class:`Batch` a scheduler drives.

    model = load(path, device="cpu", dtype=torch.float32)
    logits = model(input_ids)                               # one sequence, no cache
    cache = model.new_cache(num_blocks=64)
    step = cache.schedule({"a": len(prompt_a), "b": len(prompt_b)})
    logits = model(torch.cat([prompt_a, prompt_b]), step.positions, cache, step)
    layers = hidden_states(model, input_ids)                # per-layer, as transformers' output_hidden_states
    errors = model.prepare_kernels()                        # on a GPU: compile DeepGEMM's kernels ahead (warm-up)

Numerics: ``load(..., act_quant=True)`` (default) quantizes activations dynamically as the serving
kernels do for the checkpoint's formats; ``act_quant=False`` keeps them unquantized (the source
model with dequantized weights, what transformers computes).  Faithfulness to transformers is
tested per family in tests/engine.
"""

from .batch import Batch
from .kv_cache import KVCache
from .loader import load
from .model import CausalLM
from .run import greedy, hidden_states, prefill_logits

__all__ = ["Batch", "CausalLM", "KVCache", "greedy", "hidden_states", "load", "prefill_logits"]
