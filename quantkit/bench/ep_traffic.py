"""Bytes each rank sends per MoE layer: all-to-all dispatch and combine against the all-reduce, at EP 2-16.

    quantkit bench ep-traffic [--ckpt DIR] [--decode-tokens 64] [--prefill-tokens 2048] [--hidden 7168] [--out OUT]

Computed from real routing: the checkpoint (default: a ``quantkit synth deepseek-v3 --preset tiny-e16``
made in a temporary folder, 16 experts, top-4) routes a decode step's tokens (the last token of each of
``--decode-tokens`` prompts) and a prefill's (``--prefill-tokens`` of one batch); every MoE layer's expert
ids are recorded.  For EP = DP = W, rank r brings a contiguous 1/W of the tokens and owns experts
e * W // E == r.  Per layer and rank, from the rules of :mod:`quantkit.engine.ep_exchange` (which its
gloo test checks byte for byte against what the exchange counts):

* all-to-all, variable splits: one row per (token, other rank owning one of its experts), a row being
  ``row_bytes`` (FP8 payload + ids + weights), then a float32 partial back per row received;
* all-to-all, fixed capacity (decode): ``capacity`` = tokens per rank rows to each other rank, used or not;
* all-reduce: every rank holds the whole batch's float32 [T, H] and a ring all-reduce sends 2 (W-1)/W of it.

``--hidden`` rescales the hidden size (bytes per row) to a full-size model's while keeping the tiny
model's routing; prints a markdown table (max over ranks, mean over layers, KiB); with ``--out``, one record per
row to OUT/results.jsonl (:mod:`.record`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from quantkit.engine.ep_exchange import all_reduce_bytes, destination_slots, row_bytes

from . import prog
from .env import environment
from .record import Run

DECODE_PROMPT = 16  # tokens per decode prompt: its last one is the row a decode step routes


def routing(ckpt: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Expert ids [T, k] of every MoE layer for the last token of each prompt (one cache-less batch)."""
    from quantkit.engine import load, prefill_logits
    from quantkit.engine.layers.moe import MoE

    m = load(ckpt, "cpu", torch.bfloat16)
    seen: list[torch.Tensor] = []
    hooks = [mod.router.register_forward_hook(lambda _m, _i, out: seen.append(out[1])) for mod in m.modules() if isinstance(mod, MoE)]
    prefill_logits(m, prompts)
    for h in hooks:
        h.remove()
    return seen


def per_rank(idx: torch.Tensor, experts: int, world: int, hidden: int, payload: str, fixed: bool) -> tuple[int, int]:
    """(largest dispatch + combine bytes any rank sends, the all-reduce's per rank) for one layer."""
    t, k = idx.shape
    owner = torch.arange(experts) * world // experts
    hit = (destination_slots(idx, owner, world) >= 0).any(-1)  # [T, W]
    row, part = row_bytes(hidden, k, payload), 4 * hidden
    sent = []
    for r, rows in enumerate(torch.arange(t).tensor_split(world)):
        if fixed:
            cap = -(-t // world)
            sent.append((world - 1) * cap * (row + part))
            continue
        out_pairs = int(hit[rows].sum()) - int(hit[rows, r].sum())
        in_pairs = sum(int(hit[o, r].sum()) for q, o in enumerate(torch.arange(t).tensor_split(world)) if q != r)
        sent.append(out_pairs * row + in_pairs * part + (world - 1) * 8)  # + the row counts
    return max(sent), all_reduce_bytes(t, hidden, world)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=7168, help="bytes per row as for this hidden size")
    ap.add_argument("--payload", default="fp8-block", choices=["fp8-block", "mxfp8", "bf16"])
    ap.add_argument("--out", type=Path, default=None, help="directory for results.jsonl")
    args = ap.parse_args(argv)
    run = Run.start(__name__, argv, environment("cpu"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.ckpt
        if ckpt is None:
            from quantkit.synth import synthesize

            ckpt = Path(tmp) / "ds-e16"
            synthesize("deepseek-v3", ckpt, preset="tiny-e16")
        experts = int(json.loads((ckpt / "config.json").read_text())["n_routed_experts"])
        g = torch.Generator().manual_seed(0)
        decode = routing(ckpt, [torch.randint(0, 1900, (DECODE_PROMPT,), generator=g).tolist() for _ in range(args.decode_tokens)])
        prefill = routing(ckpt, [torch.randint(0, 1900, (args.prefill_tokens,), generator=g).tolist()])
    decode = [ids.view(args.decode_tokens, DECODE_PROMPT, -1)[:, -1] for ids in decode]
    print(f"| step | tokens | EP | a2a variable KiB | a2a fixed KiB | all-reduce KiB | a2a / all-reduce |")
    print("|---|---|---|---|---|---|---|")
    for name, layers, t in (("decode", decode, args.decode_tokens), ("prefill", prefill, args.prefill_tokens)):
        for world in (2, 4, 8, 16):
            var = [per_rank(ids, experts, world, args.hidden, args.payload, False) for ids in layers]
            fix = [per_rank(ids, experts, world, args.hidden, args.payload, True) for ids in layers]
            v, f, ar = (sum(x[0] for x in var) / len(var)), (sum(x[0] for x in fix) / len(fix)), var[0][1]
            fixed = f"{f / 1024:.0f}" if name == "decode" else "-"
            print(f"| {name} | {t} | {world} | {v / 1024:.0f} | {fixed} | {ar / 1024:.0f} | {v / ar:.2f} |")
            if args.out:
                row = {"step": name, "tokens": t, "ep": world, "hidden": args.hidden, "payload": args.payload, "a2a_variable_bytes": v,
                       "a2a_fixed_bytes": f if name == "decode" else None, "all_reduce_bytes": ar, "a2a_over_all_reduce": v / ar}
                run.write(args.out / "results.jsonl", row, ("step", "tokens", "ep", "hidden", "payload"))
