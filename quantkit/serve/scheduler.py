"""Continuous batching over the paged KV cache: the serving engine's loop.

Each :meth:`LLMEngine.step` builds one flat-token batch, as vLLM's v1 scheduler does:

1. every running request gets its next token decoded, or the next chunk of a prefill that did not
   fit one step (chunked prefill), in admission order, within ``max_num_batched_tokens``;
2. then waiting requests are admitted while the token budget, ``max_num_seqs`` and the free KV blocks
   allow, fairly across groups (the sequences of one client request): next is the first waiting
   request of the group with the fewest sequences running, first come first served among equals;
   a long prompt is prefilled in chunks.

When a running request needs a KV block and none is free, the most recently admitted request is
preempted: its blocks are released and it goes back to the front of the queue, to be recomputed
from its prompt and the tokens it already produced (vLLM's recompute preemption).

Prefix caching (vLLM's automatic prefix caching): once a request's block of tokens is full and
written, it is indexed under a hash of its tokens chained with all before them; a request being
admitted starts on the cached blocks of its longest indexed prefix (:class:`quantkit.engine.kv_cache.KVCache`).

Only the rows that are sampled (each request's last computed token) and, for requests that asked for
prompt logprobs (``echo``), its prompt rows go through the LM head.  Sampling and logprobs are
in :mod:`.sampling`; text, stop strings and streaming deltas in :mod:`.text`.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from collections.abc import Hashable

import torch

from ..engine.kv_cache import KVCache
from ..engine.model import CausalLM
from ..engine.runner import ModelRunner
from . import sampling
from .request import Ahead, EngineStats, Request, RequestError, Step, block_hash, rows_to_host
from .sampling import Draw, SamplingParams, TokenLogprobs, logprobs_at, sample
from .text import Detokenizer



class LLMEngine:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int = 16, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 2048, max_model_len: int | None = None, eos_ids: tuple[int, ...] = (),
                 prefix_caching: bool = True, cache: KVCache | None = None, enforce_eager: bool = False,
                 lookahead: bool = True) -> None:
        """``cache``: the KV cache to schedule (the model's own, new, when None; sharded serving's front end
        gives the other DP groups' schedulers a cache of block tables alone, :class:`KVCache` of no layers).
        ``enforce_eager``: no CUDA graphs (:class:`quantkit.engine.runner.ModelRunner`).  ``lookahead``: graphed
        decode steps of plain-greedy requests are launched one ahead (:meth:`step`), so the host schedules the next
        step while the GPU runs this one."""
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got {max_num_seqs}, {max_num_batched_tokens}")
        self.model = model
        self.cache = model.new_cache(num_blocks, block_size) if cache is None else cache
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        limit = int(model.config.get("max_position_embeddings", num_blocks * block_size))
        self.max_model_len = min(max_model_len or limit, limit, num_blocks * block_size)
        # token ids are checked against the config's vocabulary: in tensor-parallel serving a rank's
        # embed_tokens holds only its slice of the rows, while the gathered logits cover them all
        self.vocab_size = int(model.config["vocab_size"])
        self.eos_ids = tuple(eos_ids)
        self.prefix_caching = prefix_caching
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = EngineStats()
        self._ids = itertools.count()
        self.replayed = False  # sharded serving: other ranks replay this cache's allocations (..distributed)
        self.released: list = []  # then: sequences released since the last step, for the other ranks to release
        self.idle_tick_s: float | None = None  # how often an idle engine thread calls tick() (None: never)
        self.runner = ModelRunner(model, self.cache, max_num_seqs, self.max_model_len, enforce_eager)
        self.lookahead = lookahead
        self.ahead: Ahead | None = None  # the launched decode step whose tokens are not read back yet
        self._pinned: list[tuple[torch.Tensor, object]] = []  # two (host buffer, CUDA event) slots for those tokens, used in turn

    # --- requests -------------------------------------------------------------------------------
    def check_request(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise RequestError when the engine cannot run this prompt with these params."""
        if not prompt:
            raise RequestError("the prompt is empty: it needs at least one token")
        vocab = self.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"logit_bias token id {bad[0]} is outside the vocabulary [0, {vocab})")
        bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"stop_token_ids id {bad[0]} is outside the vocabulary [0, {vocab})")
        if len(prompt) + params.max_tokens > self.max_model_len:
            raise RequestError(f"the prompt ({len(prompt)} tokens) plus max_tokens ({params.max_tokens}) is more than "
                               f"the maximum context length of {self.max_model_len} tokens")

    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str | None = None,
                    detok: Detokenizer | None = None, checked: bool = False, group: Hashable | None = None) -> Request:
        """Queue a request (``checked``: the caller ran :meth:`check_request` on it already; ``group``: the client
        request it belongs to, for fair admission, by default its own)."""
        if not checked:
            self.check_request(prompt, params)
        r = Request(request_id or f"req-{next(self._ids)}", list(prompt), params, detok)
        r.group = r.id if group is None else group
        self.waiting.append(r)
        return r

    def abort(self, r: Request) -> None:
        if r.finished:
            return
        if r in self.waiting:
            self.waiting.remove(r)
        self._finish(r, "abort")

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_usage(self) -> float:
        return 1 - len(self.cache.free_blocks) / self.cache.num_blocks

    def _release(self, r: Request) -> None:
        if r.id in self.cache.tables:
            self.cache.release(r.id)
            if self.replayed:
                self.released.append(r.id)

    # --- scheduling ----------------------------------------------------------------------------
    def _blocks_needed(self, r: Request, n: int, start: int | None = None, held: int = 0) -> int:
        """New blocks r needs to hold tokens up to start + n (start: r.computed), beyond its table and ``held``
        more it is about to take (cached prefix blocks)."""
        have = len(self.cache.tables.get(r.id, ())) + held
        return max(0, -(-((r.computed if start is None else start) + n) // self.cache.block_size) - have)

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self._release(r)
        r.computed = r.committed = 0
        r.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(r)

    @property
    def caching(self) -> bool:
        """Prefix caching is on (not in sharded serving: the other ranks replay allocations, not cache hits)."""
        return self.prefix_caching and not self.replayed

    def _hashes(self, r: Request, n_blocks: int) -> list[bytes]:
        bs, h = self.cache.block_size, r.block_hashes
        while len(h) < n_blocks:
            i = len(h)
            h.append(block_hash(h[-1] if h else b"", r.token_slice(i * bs, (i + 1) * bs)))
        return h[:n_blocks]

    def _prefix_hit(self, r: Request) -> list[int]:
        """Cached blocks a request being admitted can start on: whole blocks, leaving at least its last token
        to compute (its logits are needed); none when it wants prompt logprobs (those rows must run)."""
        if not self.caching or r.computed or r.params.prompt_logprobs is not None:
            return []
        return self.cache.match(self._hashes(r, (r.num_tokens - 1) // self.cache.block_size))

    def _next_waiting(self) -> Request:
        """Fair admission across groups (a client request's sequences): the first waiting request of the group with
        the fewest sequences running; first come first served among equals, so a preempted request (at the front)
        goes first among equals.  A request of 256 sequences cannot hold a one-sequence request back: that one
        enters at the first free seat."""
        head = self.waiting[0]
        running = Counter(q.group for q in self.running)
        if not running[head.group]:
            return head
        return min(self.waiting, key=lambda q: running[q.group])  # min keeps the first of equals

    def _schedule(self) -> dict[Request, int]:
        budget, plan, reserved = self.max_num_batched_tokens, {}, 0  # reserved: blocks this step's earlier entries take
        running, free, i = self.running, self.cache.free_blocks, 0
        while i < len(running):  # preemption takes requests from the end of the list: r stays running[i]
            r = running[i]
            n = min(r.num_tokens - r.computed, budget)
            if n < 1:
                break
            new = self._blocks_needed(r, n)  # preempting others leaves r's need as it is
            while new > len(free) - reserved:  # the most recently admitted make room, down to r itself
                victim = running[-1]
                self._preempt(victim)
                if victim is r:
                    break
            if i == len(running):  # r was preempted, after every request behind it: nothing more runs
                break
            plan[r], budget, reserved = n, budget - n, reserved + new
            i += 1
        bs = self.cache.block_size
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            r = self._next_waiting()
            hit = self._prefix_hit(r)
            start = r.computed + len(hit) * bs
            n = min(r.num_tokens - start, budget)
            new = self._blocks_needed(r, n, start, len(hit))
            if new + self.cache.reused(hit) > len(self.cache.free_blocks) - reserved:
                if not self.running and not plan:
                    raise RuntimeError(f"request {r.id}: {n} tokens do not fit an empty KV cache of {self.cache.num_blocks} blocks")
                break
            self.waiting.remove(r)
            self.running.append(r)
            if self.caching and not r.computed:
                self.stats.prefix_queries += r.num_tokens
                self.stats.prefix_hits += len(hit) * bs
            if hit:
                self.cache.attach(r.id, hit)
                r.computed, r.committed = start, len(hit)
            plan[r], budget, reserved = n, budget - n, reserved + new
        return plan

    # --- one step --------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Request]:
        """Run one batch; the requests that advanced (new tokens, prompt logprobs, or finished).

        Lookahead (vLLM's async scheduling, for CUDA-graph decode steps of plain-greedy requests, nothing waiting):
        the next step is launched before this one's tokens are read back -- its tokens are gathered on the device
        from this step's argmax -- so the GPU runs step n + 1 while the host reads, detokenizes and accounts step
        n.  A call then launches step n + 1 and returns what step n produced.  A request that ends at step n by
        its length is left out of step n + 1; one that ends by a stop (end of sequence, stop id or string) or is
        aborted meanwhile had its step n + 1 row computed and dropped (its one token of KV written to its own
        last block, freed with it)."""
        if self.ahead is not None:
            prev, self.ahead = self.ahead, None  # (None, should the next launch raise)
            self.ahead = self._launch_ahead(prev)
            return self._land(prev)
        st = self.prepare()
        if st is None:
            return []
        if self._pipelined(st):
            self.ahead = self._launch(st, st.tokens)
            return []
        logits, top = self.runner.run(st.order, st.tokens, st.rows)
        if logits is None:
            return self.complete(st, [], {})
        # where the logits are: the samples that need more than the argmax, drawn together (sampling.sample_rows);
        # the rows of prompt logprobs go to the host
        rows, draws = self.device_draws(st, logits.device)
        picks, top_ids = sampling.sample_rows(logits, rows, draws, top)
        return self.complete(st, top_ids, rows_to_host(logits, self.host_rows(st, device_sampling=True)), dict(zip(rows, picks)))

    def _pipelined(self, st: Step) -> bool:
        """Whether step st may be launched ahead: a graphed decode step whose every row is a plain argmax."""
        run = self.runner
        if not (self.lookahead and run.buckets and not self.replayed and not self.waiting) or len(st.order) > run.buckets[-1]:
            return False
        if any(n != 1 for _, n in st.order):
            return False
        return all(now and not lp and not self._needs_row(r) for r, _, lp, now in st.wants)

    def _launch(self, st: Step, tokens: list[int] | None, prev: Ahead | None = None, src: list[int] | None = None) -> Ahead:
        """Replay decode step st (tokens from the host, or rows ``src`` of ``prev``'s argmax on the device) and
        start copying its argmax to the host, without waiting."""
        top = self.runner.replay_top(st.order, tokens, src, None if prev is None else prev.top)
        n, cuda = len(st.order), top.device.type == "cuda"
        if not self._pinned:
            size = self.runner.buckets[-1]
            self._pinned = [(torch.empty(size, dtype=torch.int64, pin_memory=cuda), torch.cuda.Event() if cuda else None) for _ in range(2)]
        # the slot the step before did not take: the one before that was read back (landed) already
        host, event = self._pinned[1] if prev is not None and prev.host is self._pinned[0][0] else self._pinned[0]
        host[:n].copy_(top[:n], non_blocking=cuda)
        if event is not None:
            event.record()
        return Ahead(st, top, host, event)

    def _launch_ahead(self, prev: Ahead) -> Ahead | None:
        """Step n + 1 behind the launched step n (``prev``), when it can go before n's tokens are read: the same
        sequences less those that end at step n by their length; None when anything needs the host first
        (a request waiting, a row that needs more than the argmax, no free block for a new position)."""
        if self.waiting:
            return None
        keep, src, bs, cache = [], [], self.cache.block_size, self.cache
        for r, at, _, _ in prev.st.wants:
            if r.finished:
                continue
            after = len(r.output) + 1  # its tokens once step n's is in
            if after >= r.params.max_tokens or r.num_tokens + 1 >= self.max_model_len:
                continue  # step n's token is its last
            if not r.argmax_only or after < r.params.min_tokens:
                return None
            keep.append(r)
            src.append(at)
        if not keep:
            return None
        new_blocks = sum(cache.lengths[r.id] >= len(cache.tables[r.id]) * bs for r in keep)
        if new_blocks > len(cache.free_blocks):
            return None
        st = Step({r: 1 for r in keep}, [(r.id, 1) for r in keep], [], list(range(len(keep))), [(r, j, [], True) for j, r in enumerate(keep)])
        return self._launch(st, None, prev, src)

    def _land(self, a: Ahead) -> list[Request]:
        """Read back a launched step's tokens and account it (:meth:`complete`)."""
        if a.event is not None:
            a.event.synchronize()
        return self.complete(a.st, a.host[: len(a.st.order)].tolist(), {})

    def prepare(self) -> Step | None:
        """Schedule the next batch (None when nothing runs): its tokens, and the logit rows it wants."""
        plan = self._schedule()
        if not plan:
            return None
        ids, rows, wants = [], [], []  # wants: (request, rows of its logits, first position, sample?)
        row = 0
        for r, n in plan.items():
            start = r.computed
            ids += r.token_slice(start, start + n)
            sample_now = start + n == r.num_tokens
            lp_rows = []
            if r.params.prompt_logprobs is not None and len(r.prompt_logprobs) < len(r.prompt):
                # rows whose next token is a prompt token not scored yet
                lp_rows = [p for p in range(start, start + n) if len(r.prompt_logprobs) <= p + 1 < len(r.prompt)]
            wants.append((r, len(rows), lp_rows, sample_now))
            if lp_rows:
                rows += [row + p - start for p in lp_rows]
            if sample_now:
                rows.append(row + n - 1)
            row += n
        return Step(plan, [(r.id, n) for r, n in plan.items()], ids, rows, wants)

    def tick(self) -> None:
        """Called while idle every ``idle_tick_s`` (sharded serving's heartbeat); nothing to do here."""

    def take_released(self) -> list:
        """Sequences released since the last call (sharded serving: the other ranks release them too)."""
        out, self.released = self.released, []
        return out

    def complete(self, st: Step, top: list[int], host: dict[int, torch.Tensor], picks: dict | None = None) -> list[Request]:
        """Account a batch that ran: ``top`` is every logit row's argmax, ``host`` the rows of
        :meth:`host_rows` on the host, ``picks`` the rows the device sampler drew (row -> its
        :data:`sampling.Pick` or the exception it raised).  The requests that advanced."""
        now = time.monotonic()
        stats, bs, caching = self.stats, self.cache.block_size, self.caching
        stats.steps += 1
        done = []
        for r, at, lp_rows, sample_now in st.wants:
            if r.finished:  # aborted, or ended by a stop, after this step was launched ahead: its row is dropped
                continue
            before, r.computed = r.computed, r.computed + st.plan[r]
            if not r.preemptions and before < len(r.prompt):  # a recomputation is not new prompt
                stats.prompt_tokens += min(r.computed, len(r.prompt)) - before
            full = r.computed // bs
            if caching and full > r.committed:  # blocks now full and written: index them for later prompts
                self.cache.commit(r.id, r.committed, self._hashes(r, full)[r.committed:])
                r.committed = full
            try:
                if lp_rows:
                    self._prompt_logprobs(r, torch.stack([host[i] for i in range(at, at + len(lp_rows))]), lp_rows)
                if sample_now:
                    i = at + len(lp_rows)
                    self._sample(r, host.get(i), top[i], now, None if picks is None else picks.get(i))
            except Exception as e:  # its own sampler, logprobs or text failed: it alone ends, the batch goes on
                self._fail(r, e)
            done.append(r)
        return done

    def _fail(self, r: Request, e: Exception) -> None:
        """End r with an error of its own (finish reason "error", ``r.error`` says what), its blocks freed."""
        r.error = f"{type(e).__name__}: {e}"
        if not r.finished:
            self._finish(r, "error")

    def _needs_row(self, r: Request) -> bool:
        """Whether sampling r needs its logits row on the host: anything but plain greedy."""
        return not r.argmax_only or len(r.output) < r.params.min_tokens

    def host_rows(self, st: Step, device_sampling: bool = False) -> list[int]:
        """The logit rows that must reach the host: prompt logprobs, and (unless the device sampler draws them)
        samples that need more than the argmax (non-greedy sampling, penalties, logprobs)."""
        need = []
        for r, at, lp_rows, sample_now in st.wants:
            need += range(at, at + len(lp_rows))
            if sample_now and not device_sampling and self._needs_row(r):
                need.append(at + len(lp_rows))
        return need

    def _banned(self, r: Request) -> tuple[int, ...]:
        """Ids r cannot draw now: before ``min_tokens``, the end-of-sequence ids (unless ignored) and stop ids."""
        p = r.params
        if len(r.output) >= p.min_tokens:
            return ()
        return (() if p.ignore_eos else self.eos_ids) + p.stop_token_ids

    def device_draws(self, st: Step, device: torch.device) -> tuple[list[int], list[Draw]]:
        """The rows the device sampler draws (samples that need more than the argmax) and their :class:`Draw`."""
        rows, draws = [], []
        for r, at, lp_rows, sample_now in st.wants:
            if sample_now and self._needs_row(r):
                rows.append(at + len(lp_rows))
                draws.append(Draw(r.params, r.generator(device), r.prompt, r.output, self._banned(r)))
        return rows, draws

    def _prompt_logprobs(self, r: Request, logits: torch.Tensor, positions: list[int]) -> None:
        if not r.prompt_logprobs:
            r.prompt_logprobs.append(None)
        nxt = torch.tensor([r.prompt[p + 1] for p in positions])
        r.prompt_logprobs += logprobs_at(logits, nxt, r.params.prompt_logprobs)

    def _sample(self, r: Request, logits: torch.Tensor | None, argmax: int, now: float, pick=None) -> None:
        """The next token of r from its logits row (None where greedy needs only ``argmax``) or the device
        sampler's ``pick``, and its stops."""
        p = r.params
        if p.prompt_logprobs is not None and not r.prompt_logprobs:
            r.prompt_logprobs.append(None)  # a one-token prompt
        if len(r.output) >= p.max_tokens:  # max_tokens 0: the prompt's logprobs only
            return self._finish(r, "length")
        early = len(r.output) < p.min_tokens  # no stop of any kind yet
        if isinstance(pick, Exception):
            raise pick
        if pick is not None:
            t = pick[0]
        elif logits is None:
            t = argmax
        else:
            t = sample(logits, p, r.gen, r.prompt, r.output, self._banned(r))
        r.output.append(t)
        self.stats.generation_tokens += 1
        if r.first_token_time is None:
            r.first_token_time = now
        if p.logprobs is not None:
            if pick is not None:
                r.logprobs.append(TokenLogprobs(t, pick[2], pick[1]))
            else:
                r.logprobs += logprobs_at(logits.view(1, -1), torch.tensor([t]), p.logprobs)
        hit = r.detok.add(t, check_stop=not early) if r.detok is not None else None
        if hit is not None:
            r.stop_reason = hit
            return self._finish(r, "stop")
        if (not p.ignore_eos and t in self.eos_ids) or t in p.stop_token_ids:
            r.stop_reason = t if t in p.stop_token_ids else None
            return self._finish(r, "stop")
        if len(r.output) >= p.max_tokens or r.num_tokens >= self.max_model_len:
            return self._finish(r, "length")

    def _finish(self, r: Request, reason: str) -> None:
        r.finish_reason, r.finish_time = reason, time.monotonic()
        if r in self.running:
            self.running.remove(r)
        self._release(r)
        if r.detok is not None:
            r.detok.finish()
        s = self.stats
        s.finished[reason] = s.finished.get(reason, 0) + 1
        s.e2e_sum += r.finish_time - r.arrival
        if r.first_token_time is not None:
            s.ttft_sum += r.first_token_time - r.arrival

    def warm_up(self) -> tuple[int, float]:
        """Run dummy requests through the kinds of step a server meets -- prefills of 1 to a whole token budget and
        an odd tail, prefill chunks mixed with decodes, greedy and device-sampled decodes -- so that every kernel
        specialisation they need compiles now rather than during a client's request (on the H200 a first
        mixed step of a new size waited seconds for Triton).  Leaves no request, no block in use and fresh
        stats; the dummy prompts' blocks may stay in the prefix cache, free.  Returns (steps, seconds)."""
        t0, vocab, steps = time.monotonic(), self.vocab_size, 0
        budget = self.max_num_batched_tokens
        greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        drawn = SamplingParams(max_tokens=3, temperature=1.0, top_k=50, top_p=0.9, seed=0, ignore_eos=True)
        phases = [[budget + 37], [1], [17], [100], [300], [1000], [300, 64, 17, 5, 1, 2]]
        for i, lengths in enumerate(phases):
            reqs = []
            for j, n in enumerate(lengths):
                n = max(1, min(n, self.max_model_len - 3, self.cache.num_blocks * self.cache.block_size // 2))
                prompt = [(7919 * (i * 31 + j) + 13 * k) % vocab for k in range(n)]
                reqs.append(self.add_request(prompt, drawn if j % 2 else greedy, f"warm-up-{i}-{j}"))
            while any(not r.finished for r in reqs):
                self.step()
                steps += 1
        if self.ahead is not None:  # a step launched ahead for requests that ended meanwhile: read it, drop it
            self._land(self.ahead)
            self.ahead = None
        self.stats = EngineStats()
        return steps, time.monotonic() - t0

    def run_all(self) -> None:
        """Step until every request has finished (offline use and tests)."""
        while self.has_work():
            self.step()
