"""Host time of the serving engine's decode step, measured on the CPU with the model's work stubbed out.

    quantkit bench host-overhead                      # C = 1, 32, 256: median host us per step and per request
    quantkit bench host-overhead --profile 256        # and a cProfile of the decode steps at C = 256

On the GPU a graphed decode step is serialized with the host: the step waits for the argmax ids, the host
schedules, builds the next step's metadata, samples and detokenizes, then the next graph launches.  This
times that host part alone: :class:`LLMEngine` on the tiny synthesized Qwen3 (its tokenizer, its config),
with a :class:`HostOnlyRunner` in place of the model runner.  That is :class:`ModelRunner`'s graphed decode
path as it is (``static``: static buffers, padded buckets, :meth:`KVCache.schedule_decode`, the staging
copies), only its forward returns fixed logits and argmax ids instead of running the model; prefill steps
allocate their cache slots and return the same.  Scheduling, metadata, sampling bookkeeping, stops and
detokenization are all the engine's own.

Each of C greedy requests (end of sequence ignored, ``--gen`` new tokens, ``--prompt-len`` random prompt ids,
a :class:`Detokenizer` attached as the server does) is prefilled, then every decode step is timed.  The
digest of the outputs, texts and counters shows whether a change to the engine changed what it computes.
With ``--out``, one record per C to OUT/results.jsonl (:mod:`.record`).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import statistics
import tempfile
import time
from collections.abc import Hashable
from pathlib import Path

import torch

from quantkit.engine import load
from quantkit.engine.kv_cache import KVCache
from quantkit.engine.runner import ModelRunner
from quantkit.serve.sampling import SamplingParams
from quantkit.serve.scheduler import LLMEngine
from quantkit.serve.text import ModelText
from quantkit.synth import synthesize

from . import prog
from .env import environment
from .record import Run

PERIOD = 7  # distinct fixed outputs the stub cycles through, so each request's text is not one token repeated


class HostOnlyRunner(ModelRunner):
    """:class:`ModelRunner` with the forward replaced by fixed outputs: only the host's work is left."""

    def __init__(self, model, cache: KVCache, max_num_seqs: int, max_model_len: int, text_ids: int) -> None:
        super().__init__(model, cache, max_num_seqs, max_model_len, static=True)
        g = torch.Generator().manual_seed(0)
        vocab, top = int(model.config["vocab_size"]), self.buckets[-1]
        # the argmax of every row is an ordinary text token (below text_ids): [PERIOD, top] int64
        self.ids = torch.randint(0, text_ids, (PERIOD, top), generator=g)
        self.logits = torch.randn(PERIOD, top, vocab, generator=g)  # [PERIOD, top, V] float32
        self.logits.scatter_(2, self.ids.unsqueeze(2), 10.0)
        self.calls = 0

    def _forward(self, b: int) -> dict[str, torch.Tensor]:
        k, self.calls = self.calls % PERIOD, self.calls + 1
        return {"logits": self.logits[k, :b], "top": self.ids[k, :b]}

    def run(self, order: list[tuple[Hashable, int]], tokens, rows: list[int]):
        if order and len(order) <= self.buckets[-1] and all(n == 1 for _, n in order):
            return self._replay(order, tokens, rows)
        self.cache.schedule(dict(order))  # a prefill step: its slots allocated, its forward stubbed
        if not rows:
            return None, None
        out = self._forward(len(rows))
        return out["logits"], out["top"]


def run(model, text: ModelText, c: int, a: argparse.Namespace, profile: cProfile.Profile | None) -> tuple[list[float], str]:
    """Decode-step host times (seconds) of C requests, and the digest of what the engine produced."""
    bs, seqs = 16, a.max_num_seqs
    blocks = c * -(-(a.prompt_len + a.gen) // bs) + 1  # every sequence's full context, and the scratch block
    cache = KVCache([], blocks, bs)  # block tables only: no layer is written
    eng = LLMEngine(model, blocks, bs, seqs, a.max_num_batched_tokens, eos_ids=text.eos_ids, cache=cache)
    eng.runner = HostOnlyRunner(model, cache, seqs, eng.max_model_len, a.text_ids)
    g = torch.Generator().manual_seed(1)
    params = SamplingParams(max_tokens=a.gen, temperature=0, ignore_eos=True)
    reqs = [eng.add_request(torch.randint(0, a.text_ids, (a.prompt_len,), generator=g).tolist(), params,
                            detok=None if a.no_detok else text.detokenizer()) for _ in range(c)]
    while any(not r.output for r in reqs):  # prefill (the stub makes it quick), not timed
        eng.step()
    eng.runner.capture()  # the static buffers, made before the first decode step as a server does at start-up
    times = []
    while eng.has_work():
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
        if profile is not None:
            profile.disable()
    h = hashlib.sha256()
    for r in reqs:
        h.update(repr((r.output, r.detok and r.detok.text, r.finish_reason)).encode())
    s = eng.stats
    h.update(repr((s.prompt_tokens, s.generation_tokens, s.steps, s.preemptions, s.finished)).encode())
    return times, h.hexdigest()[:12]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,32,256", help="comma list")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=256, help="the graph buckets go up to it (and the stub's outputs depend on it)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=3, help="runs per concurrency; the median is over all their steps")
    p.add_argument("--no-detok", action="store_true", help="no Detokenizer (what detokenization costs)")
    p.add_argument("--profile", type=int, default=None, help="cProfile the decode steps at this concurrency")
    p.add_argument("--out", type=Path, default=None, help="directory for results.jsonl")
    a = p.parse_args(argv)
    a.concurrency = [int(c) for c in a.concurrency.split(",")]
    if max(a.concurrency) > a.max_num_seqs:
        p.error(f"a concurrency of {max(a.concurrency)} needs --max-num-seqs >= it")
    record = Run.start(__name__, argv, environment("cpu"))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "qwen3-tiny"
        synthesize("qwen3", ckpt, preset="tiny")
        model = load(ckpt, "cpu", torch.float32)
        text = ModelText(ckpt, model.config)
        a.text_ids = text.tok.get_vocab_size(with_added_tokens=False)  # the ordinary tokens, below the special ones
        print(f"{'C':>5} {'steps':>6} {'us/step':>9} {'us/request':>11}  digest")
        for c in a.concurrency:
            prof = cProfile.Profile() if a.profile == c else None
            times, digests = [], set()
            for _ in range(a.repeat):
                t, d = run(model, text, c, a, prof)
                times += t
                digests.add(d)
            med = statistics.median(times) * 1e6
            print(f"{c:>5} {len(times):>6} {med:>9.0f} {med / c:>11.2f}  {','.join(sorted(digests))}")
            if a.out:
                row = {"concurrency": c, "steps": len(times), "host_us_per_step": med, "host_us_per_request": med / c, "digest": ",".join(sorted(digests))}
                record.write(a.out / "results.jsonl", row, ("concurrency",))
            if prof is not None:
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
