"""Sampling parameters and the next-token sampler of the serving engine.

The rules are the ones OpenAI-compatible servers (vLLM, SGLang) apply, in their order:
``temperature`` below ``TEMPERATURE_FLOOR`` (1e-5, vLLM's ``_SAMPLING_EPS``) is greedy (argmax, the lowest id on
a tie): dividing by a smaller one sends logits to infinity and the distribution to NaN (1e-300 did),
while at the floor float32 logits of magnitude 1e3 stay within 1e8; otherwise the logits are divided
by the temperature, cut to the ``top_k`` largest, then to the smallest set whose probability
reaches ``top_p`` (the most likely token always stays), and one token is drawn.  Before that,
``logit_bias`` and the presence / frequency / repetition penalties adjust the logits (:func:`adjust`).

Each request draws from its own ``torch.Generator``, seeded with the request's ``seed`` (or a fresh
random seed): the same seed gives the same tokens whatever other requests share its batches.
Log-probabilities are those of the model's raw distribution (before temperature and truncation), as
vLLM reports them by default.

Two samplers compute these rules.  :func:`sample` takes one row of logits on the CPU (sharded serving
gathers the rows there) and draws with ``torch.multinomial``.  :func:`sample_rows` takes a step's rows
where the logits are (the GPU) and draws them together, as vLLM's sampler does: the adjustments row by
row, then temperature, top-k and top-p for all rows at once, and the draw as an exponential race (the
argmax of p / E with E ~ Exp(1) drawn from the request's own generator: token i wins with probability
p_i); the chosen ids and requested log-probs then reach the host in one copy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

MAX_LOGPROBS = 20  # the OpenAI API's limit on top logprobs per token
TEMPERATURE_FLOOR = 1e-5  # below it sampling is greedy (the sampler divides by the temperature)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no cut
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one found
    stop_token_ids: tuple[int, ...] = ()  # besides the model's end-of-sequence ids
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the top k
    prompt_logprobs: int | None = None  # the same for the prompt tokens (echo)
    include_stop_str: bool = False
    presence_penalty: float = 0.0  # minus this for every token already generated
    frequency_penalty: float = 0.0  # minus this times how often a token was generated
    repetition_penalty: float = 1.0  # a prompt or generated token's logit divided by it (times it when negative)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # no end of sequence, stop token or stop string before this many tokens

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {k}")
        if any(not s for s in self.stop):
            raise ValueError("a stop string must not be empty")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}")
        if any(not -100 <= b <= 100 for _, b in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")

    @property
    def adjusts(self) -> bool:
        """Whether logits are changed before sampling (bias or penalties)."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def greedy(self) -> bool:
        return self.temperature < TEMPERATURE_FLOOR or self.top_k == 1


@dataclass
class TokenLogprobs:
    """One position: the chosen token's logprob and the ``k`` most likely (id, logprob), best first."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def new_seed(seed: int | None) -> int:
    """The request's seed, or a fresh random one."""
    return seed if seed is not None else random.SystemRandom().randrange(2**63)


def new_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(new_seed(seed))


def _truncate(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits [V] with everything outside top-k / top-p set to -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        probs, order = torch.sort(torch.softmax(logits, -1), descending=True)
        before = torch.cumsum(probs, -1) - probs  # mass of the strictly more likely tokens
        drop = order[before >= top_p]
        logits = logits.index_fill(0, drop, float("-inf"))
    return logits


def adjust(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Logits [V] after ``logit_bias`` and the penalties, in vLLM's order: the bias, then the repetition
    penalty over prompt and generated tokens (a positive logit divided by it, a negative one multiplied),
    then the frequency and presence penalties over the generated tokens."""
    x, dev = logits.clone(), logits.device
    if params.logit_bias:
        ids, bias = zip(*params.logit_bias)
        x.index_add_(0, torch.tensor(ids, dtype=torch.int64, device=dev), torch.tensor(bias, dtype=x.dtype, device=dev))
    if params.repetition_penalty != 1:
        seen = torch.unique(torch.tensor(prompt + output, dtype=torch.int64, device=dev))
        v = x[seen]
        x[seen] = torch.where(v > 0, v / params.repetition_penalty, v * params.repetition_penalty)
    if output and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(output, dtype=torch.int64, device=dev), minlength=x.shape[0]).to(x.dtype)
        x -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(x.dtype)
    return x


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator, prompt: list[int] = (), output: list[int] = (),
           banned: tuple[int, ...] = ()) -> int:
    """One token id from float32 logits [V] (on the CPU); ``prompt`` and ``output`` feed the penalties;
    ``banned`` ids cannot be drawn (the end-of-sequence ids before ``min_tokens``)."""
    if params.adjusts:
        logits = adjust(logits, params, list(prompt), list(output))
    if banned:
        logits = logits.index_fill(0, torch.tensor(banned, dtype=torch.int64), float("-inf"))
    if params.greedy:
        return int(torch.argmax(logits))
    x = _truncate(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(x, -1)
    return int(torch.multinomial(probs, 1, generator=gen))


def logprobs_at(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> list[TokenLogprobs]:
    """Rows of logits [N, V] and the token each row is scored on [N]: its logprob and the top ``k``."""
    lp = torch.log_softmax(logits.float(), -1)
    chosen = lp.gather(1, tokens.view(-1, 1)).view(-1).tolist()
    if k > 0:
        vals, ids = torch.topk(lp, k, -1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
    else:
        tops = [[] for _ in chosen]
    return [TokenLogprobs(int(t), c, top) for t, c, top in zip(tokens.tolist(), chosen, tops)]


@dataclass
class Draw:
    """One logit row to sample in :func:`sample_rows`: its request's parameters, generator (on the logits'
    device), token history (for the penalties) and banned ids."""

    params: SamplingParams
    gen: torch.Generator
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    banned: tuple[int, ...] = ()


def _truncate_rows(z: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """:func:`_truncate` of every row of z [n, V] with its own top_k (-1: none) and top_p."""
    n, v = z.shape
    dev = z.device
    if any(0 < k < v for k in top_k):
        kmax = max(k for k in top_k if 0 < k < v)
        ks = torch.tensor([k if 0 < k < v else 1 for k in top_k], device=dev)
        kth = torch.topk(z, kmax, dim=-1).values.gather(1, (ks - 1)[:, None])
        none = torch.tensor([not 0 < k < v for k in top_k], device=dev)[:, None]
        z = z.masked_fill((z < kth) & ~none, float("-inf"))
    if any(p < 1 for p in top_p):
        probs, order = torch.sort(torch.softmax(z, -1), dim=-1, descending=True)
        before = torch.cumsum(probs, -1) - probs  # mass of the strictly more likely tokens
        drop = before >= torch.tensor(top_p, dtype=probs.dtype, device=dev)[:, None]
        z = z.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    return z


def prepare_row(row: torch.Tensor, d: Draw) -> torch.Tensor | None:
    """A row's logits after its request's bias, penalties and banned ids (None: none apply)."""
    if not (d.params.adjusts or d.banned):
        return None
    x = adjust(row, d.params, list(d.prompt), list(d.output)) if d.params.adjusts else row
    if d.banned:
        x = x.index_fill(0, torch.tensor(d.banned, dtype=torch.int64, device=row.device), float("-inf"))
    return x


Pick = tuple[int, list[tuple[int, float]], float]  # (token id, top (id, logprob) pairs, the token's logprob)


def sample_rows(logits: torch.Tensor, rows: list[int], draws: list[Draw], also: torch.Tensor | None = None) -> tuple[list[Pick | Exception], list[int]]:
    """The next token of each of ``rows`` of ``logits`` [N, V] (any float dtype, on its device), drawn by the
    rules of :func:`sample`: per row a :data:`Pick` (its top pairs and logprob when its request asks for
    logprobs, else [] and 0.0), or the exception its own adjustments raised (the other rows go on).  One copy
    to the host for the whole step, which brings ``also`` (int ids on the device, e.g. every row's argmax) along."""
    n = len(rows)
    if not n:
        return [], ([] if also is None else also.tolist())
    dev = logits.device
    raw = logits.index_select(0, torch.tensor(rows, device=dev)).float()  # [n, V]
    x, failed = raw, {}
    for i, d in enumerate(draws):
        try:
            row = prepare_row(raw[i], d)
        except Exception as e:  # this request's own failure: it alone ends
            failed[i] = e
            continue
        if row is not None:
            if x is raw:
                x = raw.clone()
            x[i] = row
    ids = x.argmax(-1)  # the greedy rows' pick (the lowest id on a tie)
    hot = [i for i, d in enumerate(draws) if not d.params.greedy and i not in failed]
    if hot:
        sel = torch.tensor(hot, device=dev)
        temp = torch.tensor([draws[i].params.temperature for i in hot], dtype=x.dtype, device=dev)
        z = _truncate_rows(x[sel] / temp[:, None], [draws[i].params.top_k for i in hot], [draws[i].params.top_p for i in hot])
        probs = torch.softmax(z, -1)
        race = torch.stack([torch.empty(probs.shape[1], device=dev).exponential_(generator=draws[i].gen) for i in hot])
        ids[sel] = (probs / race.clamp_min(torch.finfo(torch.float32).tiny)).argmax(-1)
    ks = [d.params.logprobs for d in draws]
    kmax = max((k for k in ks if k is not None), default=None)
    parts = [ids.to(torch.float64)]
    extra = 0 if also is None else also.numel()
    if kmax is not None:
        lp = torch.log_softmax(raw, -1)
        parts.append(lp.gather(1, ids[:, None])[:, 0].double())
        if kmax > 0:
            vals, top = torch.topk(lp, kmax, dim=-1)
            parts += [top.double().flatten(), vals.double().flatten()]
    if extra:
        parts.append(also.to(torch.float64).flatten())  # ids below 2**53: exact in float64
    flat = torch.cat(parts).tolist()  # the one copy to the host
    carried = [int(v) for v in flat[len(flat) - extra :]] if extra else []
    out: list = []
    for i in range(n):
        if i in failed:
            out.append(failed[i])
            continue
        k = ks[i]
        if k is None:
            out.append((int(flat[i]), [], 0.0))
            continue
        top_ids = flat[2 * n + i * kmax : 2 * n + i * kmax + k] if kmax else []
        top_vals = flat[2 * n + n * kmax + i * kmax : 2 * n + n * kmax + i * kmax + k] if kmax else []
        out.append((int(flat[i]), [(int(a), b) for a, b in zip(top_ids, top_vals)], flat[n + i]))
    return out, carried
