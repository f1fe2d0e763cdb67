"""What the serving engine schedules and reports: a :class:`Request` (its prompt, parameters, output and
state), a scheduled :class:`Step`, an :class:`Ahead` (a decode step launched before its tokens were read
back), the engine's counters (:class:`EngineStats`), the errors a request or the engine ends with, and the
copies of a step's logits to the host.  :mod:`.scheduler` runs them."""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from .sampling import SamplingParams, TokenLogprobs, new_seed
from .text import Detokenizer


def to_host(logits: torch.Tensor | None, need: list[int], top: torch.Tensor | None = None) -> tuple[list[int], dict[int, torch.Tensor]]:
    """Every row's argmax (``top``, or taken here on the device in one call), and on the host, in float32, only
    the rows in ``need``: a greedy batch moves B ids, not B x vocab floats."""
    if logits is None:
        return [], {}
    return (logits.argmax(-1) if top is None else top).tolist(), rows_to_host(logits, need)


def rows_to_host(logits: torch.Tensor, need: list[int]) -> dict[int, torch.Tensor]:
    """Row i of logits -> that row in float32 on the host, for each i in ``need`` (one copy)."""
    if not need:
        return {}
    rows = logits[need].to(torch.float32).cpu()
    return {i: rows[k] for k, i in enumerate(need)}


class EngineBroken(RuntimeError):
    """The engine cannot step any more (sharded serving lost a rank): the server stops with this error."""


class RequestError(ValueError):
    """A request the engine cannot run (too long for the model or the cache): the client's error."""


@dataclass(eq=False)
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams
    detok: Detokenizer | None = None
    arrival: float = field(default_factory=time.monotonic)
    output: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)  # first entry None (no context)
    computed: int = 0  # tokens of prompt + output whose keys are in the cache
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    error: str | None = None  # why it failed ("error"): its own sampling or text, not the batch's forward
    stop_reason: int | str | None = None  # the stop token or string that ended it
    first_token_time: float | None = None
    finish_time: float | None = None
    preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)  # prefix caching: hashes of its full token blocks so far
    committed: int = 0  # blocks indexed in the cache
    group: Hashable = None  # the client request it belongs to: admission is fair across groups

    def __post_init__(self) -> None:
        self.seed = new_seed(self.params.seed)
        self.gen = torch.Generator().manual_seed(self.seed)  # the host sampler's (sharded serving)
        self.device_gen: torch.Generator | None = None  # the device sampler's, made on first use
        p = self.params
        # plain greedy: once past min_tokens its argmax alone picks the next token (no logits row, no draw)
        self.argmax_only = p.greedy and not p.adjusts and p.logprobs is None

    def generator(self, device: torch.device) -> torch.Generator:
        """This request's generator on ``device`` (seeded alike on every device)."""
        if device.type == "cpu":
            return self.gen
        if self.device_gen is None or self.device_gen.device != device:
            self.device_gen = torch.Generator(device=device).manual_seed(self.seed)
        return self.device_gen

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def token_slice(self, start: int, stop: int) -> list[int]:
        """tokens[start:stop] without building the whole list (a decode step reads one token)."""
        n = len(self.prompt)
        if start >= n:  # generated tokens only (a decode step)
            return self.output[start - n:stop - n]
        return self.prompt[start:min(stop, n)] + self.output[:max(stop - n, 0)]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def block_hash(prev: bytes, tokens: list[int]) -> bytes:
    """A full block's key: its tokens chained with the hash of every block before it."""
    return hashlib.blake2b(prev + array("q", tokens).tobytes(), digest_size=16).digest()


@dataclass(eq=False)
class Step:
    """One scheduled batch before its forward: the new tokens of each sequence (``order``, in the flat
    ``tokens``), the logit rows wanted, and per request (``wants``) where its rows are."""

    plan: dict[Request, int]
    order: list[tuple[str, int]]
    tokens: list[int]  # the flat token ids [T]
    rows: list[int]
    wants: list[tuple[Request, int, list[int], bool]]  # (request, first row, prompt-logprob positions, sample?)


@dataclass(eq=False)
class Ahead:
    """A decode step launched before the host read its tokens back (the scheduler's lookahead): its Step, its
    argmax ids on the device, their pinned host copy and the event that marks the copy done (None: synchronous)."""

    st: Step
    top: torch.Tensor
    host: torch.Tensor
    event: object


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache at admission
    prefix_hits: int = 0  # of those, tokens found cached (not computed again)
    generation_tokens: int = 0
    steps: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    ttft_sum: float = 0.0
    e2e_sum: float = 0.0
