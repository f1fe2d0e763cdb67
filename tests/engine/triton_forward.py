"""Run a tiny model through the engine twice -- the ops' torch references, and every op that has a
Triton backend on Triton -- and print both runs' logits as JSON.  Meant for ``TRITON_INTERPRET=1``
on a CPU (set before import, so it runs in a fresh process: ``python tests/engine/triton_forward.py CKPT``)
or for a CUDA device (``--device cuda``).

Steps, through a paged KV cache of 4-token blocks: a prefill of two sequences (5 and 3 tokens:
``attention_prefill`` over the cache), one decode step (``attention_decode``), and a cache-less
prefill (ragged ``attention_prefill``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from quantkit.engine import load
from quantkit.engine.model import CausalLM
from quantkit.kernels import dispatch

PROMPTS = ([5, 17, 3, 99, 42], [7, 1, 64])


def triton_ops() -> dict[str, str]:
    """Every registered op that has a Triton backend -> "triton" (the rest stay on the model's default)."""
    return {op: "triton" for op in dispatch.ops() if "triton" in dispatch.backends(op)}


@torch.no_grad()
def run(model: CausalLM) -> list[torch.Tensor]:
    """Logits float32 of each step (see the module docstring), on the CPU."""
    dev = model.device
    cache = model.new_cache(8, 4)
    step = cache.schedule({0: len(PROMPTS[0]), 1: len(PROMPTS[1])})
    ids = torch.tensor([*PROMPTS[0], *PROMPTS[1]], device=dev)
    prefill = model(ids, step.positions, cache, step)
    step = cache.schedule({0: 1, 1: 1})
    decode = model(torch.tensor([11, 12], device=dev), step.positions, cache, step)
    ragged = model(torch.tensor(PROMPTS[0], device=dev))
    return [t.cpu() for t in (prefill, decode, ragged)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    ref = run(load(args.ckpt, "cpu", dtype, backend="torch"))
    t0 = time.perf_counter()
    model = load(args.ckpt, args.device, dtype, per_op=triton_ops())
    got = run(model)
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "ran": model.ops.ran,
        "seconds": seconds,
        "max_abs_diff": [(g - r).abs().max().item() for g, r in zip(got, ref, strict=True)],
        "max_abs_ref": [r.abs().max().item() for r in ref],
        "argmax_equal": [bool(torch.equal(g.argmax(-1), r.argmax(-1))) for g, r in zip(got, ref, strict=True)],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
