"""How far a sharded model's numbers are from the unsharded model's, beside reduction order alone.

    quantkit bench sharded-gap --family gpt-oss --to mxfp8 --ep 2 --tp 2 [--dtype bfloat16] [--no-act-quant] [--out OUT]

Synthesizes the family's tiny checkpoint, converts it (``--to``), shards it (``--ep``/``--tp``) and runs
the same token sequences teacher-forced (one cache-less prefill, no sampling) through:

  whole     the unsharded conversion, as ``quantkit serve`` runs it (the reference of the comparison)
  sharded   its shard, one process per rank over gloo, as ``torchrun ... quantkit serve`` runs it
  reversed  the unsharded conversion with every MoE layer's experts relabelled e -> E-1-e (router rows,
            expert weights and biases moved with them): the same function, whose per-token sum over the
            routed experts runs in the reverse order; with top-2 routing a sum of two is the same
            either way, so this baseline only moves anything at top-k >= 3 (GPT-OSS)
  k-split   (a bf16 conversion, --tp > 1) the unsharded conversion with o_proj and the dense MLPs' down_proj
            computed as --tp partial products over slices of their input features, summed in float32:
            the reduction order of tensor parallel's row-parallel projections, in one process
  float32   the unsharded conversion in float32 without activation quantization (how large the
            dtype's and the activation quantization's own error is)

and prints, against ``whole``, the largest and mean |difference| of the next tokens' log-probabilities,
the top-1 agreement and the mean KL(whole || other) per position.  docs/serve.md records the figures; with
``--out``, one record per run to OUT/results.jsonl (:mod:`.record`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

from quantkit.converters import ConvertOptions, convert
from quantkit.engine import load, prefill_logits
from quantkit.engine.layers.mlp import MLP
from quantkit.engine.layers.moe import MoE
from quantkit.engine.qlinear import Dense, Linear
from quantkit.serve.distributed import sharded_root
from quantkit.serve.launch import load_rank
from quantkit.shard import shard
from quantkit.synth import synthesize

from . import prog
from .env import environment
from .record import Run


def sequences(n: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def next_logprobs(logits: list[torch.Tensor]) -> list[torch.Tensor]:
    """Log-probabilities float32 [len - 1, V] of each sequence's positions that have a next token."""
    return [torch.log_softmax(lg[:-1].float(), -1) for lg in logits]


def compare(ref: list[torch.Tensor], other: list[torch.Tensor], seqs: list[list[int]]) -> dict[str, float]:
    diff, agree, kl = [], [], []
    for a, b, s in zip(ref, other, seqs):
        nxt = torch.tensor(s[1:]).view(-1, 1)
        diff.append((a.gather(1, nxt) - b.gather(1, nxt)).abs().view(-1))
        agree.append((a.argmax(-1) == b.argmax(-1)).float())
        kl.append((a.exp() * (a - b)).sum(-1))
    d, t, k = torch.cat(diff), torch.cat(agree), torch.cat(kl)
    return {"max_dlogprob": d.max().item(), "mean_dlogprob": d.mean().item(), "top1": t.mean().item(), "kl": k.mean().item()}


def reverse_experts(model) -> int:
    """Relabel every MoE layer's routed experts e -> E-1-e in place; the number of layers relabelled."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    for moe in layers:
        e = moe.experts.num_experts
        flip = torch.arange(e - 1, -1, -1)
        for mod in (moe.router, *moe.experts.modules()):  # the experts' stacked weights: [E, ...] buffers
            for name, buf in list(mod.named_buffers(recurse=False)):
                if buf is not None and buf.dim() and buf.shape[0] == e:
                    setattr(mod, name, buf[flip].contiguous())
        moe.experts.fused, moe.experts.path = moe.experts._fuse()  # the fused op's view of the new buffers
    return len(layers)


class KSplit(Linear):
    """A dense projection as ``parts`` float32 partial products over slices of its input features, summed
    in float32 and rounded once (what the TP group's row-parallel projection computes)."""

    def __init__(self, inner: Linear, parts: int) -> None:
        super().__init__(inner.weight, inner.bias)
        self.parts = parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.dequant()  # float32 [N, K]
        k = w.shape[1] // self.parts
        y = sum(torch.nn.functional.linear(x[..., i * k:(i + 1) * k].float(), w[:, i * k:(i + 1) * k]) for i in range(self.parts))
        return (y if self.bias is None else y + self.bias.float()).to(x.dtype)


def split_rows(model, parts: int) -> int:
    """Replace o_proj and the dense MLPs' down_proj (dense weights only) by their :class:`KSplit`; how many."""
    n = 0
    for mod in list(model.modules()):
        name = "down_proj" if isinstance(mod, MLP) else "o_proj" if isinstance(getattr(mod, "o_proj", None), Linear) else None
        if name is not None:
            lin = getattr(mod, name)
            if not isinstance(lin.weight, Dense):
                raise SystemExit("k-split runs on dense weights only (--to bf16)")
            setattr(mod, name, KSplit(lin, parts))
            n += 1
    return n


def _rank(rank: int, world: int, port: int, dst: str, dtype: str, act_quant: bool, seqs: list[list[int]], out: str) -> None:
    """One process of the sharded run (torchrun's variables set here, as torchrun would)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    model, *_ = load_rank(Path(dst), sharded_root(dst), "cpu", dtype, act_quant)
    with torch.no_grad():
        logits = prefill_logits(model, seqs)
    if rank == 0:
        torch.save([lg.float() for lg in logits], out)


def sharded_logits(dst: Path, world: int, dtype: str, act_quant: bool, seqs: list[list[int]]) -> list[torch.Tensor]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = dst.parent / "sharded-logits.pt"
    mp.spawn(_rank, (world, port, str(dst), dtype, act_quant, seqs, str(out)), nprocs=world)
    return torch.load(out)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="gpt-oss", choices=("gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe"))
    p.add_argument("--to", default="mxfp8", choices=("fp8-block", "mxfp8", "bf16"))
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--act-quant", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seqs", type=int, default=4)
    p.add_argument("--len", type=int, default=64)
    p.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    p.add_argument("--out", type=Path, default=None, help="directory for results.jsonl")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="sharded-gap-") as d:
        work = Path(d)
        synthesize(a.family, work / "src", preset="tiny")
        convert(work / "src", work / "cv", ConvertOptions(to=a.to))
        shard(work / "cv", work / "sharded", ep=a.ep, tp=a.tp)
        vocab = int(load(work / "cv", dtype=torch.float32, act_quant=False).config["vocab_size"])
        seqs = sequences(a.seqs, a.len, vocab)
        with torch.no_grad():
            model = load(work / "cv", dtype=getattr(torch, a.dtype), act_quant=a.act_quant)
            whole = next_logprobs(prefill_logits(model, seqs))
            runs = {"sharded": next_logprobs(sharded_logits(work / "sharded", a.ep, a.dtype, a.act_quant, seqs))}
            if reverse_experts(model):
                runs["reversed"] = next_logprobs(prefill_logits(model, seqs))
            if a.to == "bf16" and a.tp > 1:
                model = load(work / "cv", dtype=getattr(torch, a.dtype), act_quant=a.act_quant)
                split_rows(model, a.tp)
                runs["k-split"] = next_logprobs(prefill_logits(model, seqs))
            runs["float32"] = next_logprobs(prefill_logits(load(work / "cv", dtype=torch.float32, act_quant=False), seqs))
    rows = {name: compare(whole, lp, seqs) for name, lp in runs.items()}
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        record = Run.start(__name__, argv, environment("cpu"))
        for name, c in rows.items():
            row = {"family": a.family, "to": a.to, "ep": a.ep, "tp": a.tp, "dtype": a.dtype, "act_quant": a.act_quant, "run": name, **c}
            record.write(a.out / "results.jsonl", row, ("family", "to", "ep", "tp", "dtype", "act_quant", "run"))
    if a.json:
        print(json.dumps(rows))
        return
    print(f"{a.family} {a.to} EP {a.ep} TP {a.tp} {a.dtype} act-quant {'on' if a.act_quant else 'off'}: "
          f"{a.seqs} x {a.len - 1} teacher-forced positions, against the unsharded model")
    print(f"{'run':<10}{'max |dlogprob|':>16}{'mean |dlogprob|':>17}{'top-1':>8}{'mean KL':>11}")
    for name, c in rows.items():
        print(f"{name:<10}{c['max_dlogprob']:>16.2e}{c['mean_dlogprob']:>17.2e}{c['top1']:>8.3f}{c['kl']:>11.2e}")

