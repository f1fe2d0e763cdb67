"""Response bodies and stream chunks of the OpenAI completions and chat APIs, from engine deltas.

Each body is checked by its pydantic response model (the OpenAI field names, vLLM's ``protocol.py``)
and written with only the fields given (``exclude_unset``), as the OpenAI API leaves absent fields out.
Non-finite numbers are refused by the models (``allow_inf_nan=False``): a model whose weights produce
NaN logprobs fails its request with a clear 500, never with invalid JSON.

Choices are numbered prompt-major (``prompt_index * n + j``) as the OpenAI API numbers them.  Usage
counts each prompt once and every choice's generated tokens.  With ``echo`` the prompt's text (and,
with ``logprobs``, its per-token logprobs, the first one null) comes before the completion, the way
lm-eval-harness reads loglikelihoods.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .protocol import ProtocolError, explain
from .sampling import TokenLogprobs
from .text import split_harmony


class _Out(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Out):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(_Out):
    """A whole completion (``object: text_completion``) and, with one choice or none, a stream chunk."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[ChatLogprob]


class ChatMessage(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None


class ChatChoice(_Out):
    index: int
    message: ChatMessage | None = None  # a whole response
    delta: ChatMessage | None = None  # a stream chunk
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatResponse(_Out):
    id: str
    object: Literal["chat.completion", "chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


def render(model: type[_Out], body: dict) -> str:
    """``body`` checked by its response model, as JSON; a value JSON cannot carry is a 500 naming it."""
    try:
        return model.model_validate(body).model_dump_json(exclude_unset=True)
    except ValidationError as e:
        raise ProtocolError(f"the response cannot be written: {explain(e)} (the model produced a non-finite number: "
                            "its weights or activations hold NaN or infinity)", 500) from None


def completion_logprobs(entries: list[TokenLogprobs | None], tokens: list[int], token_str, offset: int) -> dict:
    """The completions ``logprobs`` object over ``tokens`` (None entries: the prompt's first token)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t, e in zip(tokens, entries):
        s = token_str(t)
        out["tokens"].append(s)
        out["token_logprobs"].append(None if e is None else e.logprob)
        out["top_logprobs"].append(None if e is None else {token_str(i): lp for i, lp in e.top})
        out["text_offset"].append(offset)
        offset += len(s)
    return out


def chat_logprobs(entries: list[TokenLogprobs], token_str) -> list[dict]:
    def one(t: int, lp: float) -> dict:
        s = token_str(t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    return [{**one(e.token, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]} for e in entries]


def _usage(h, reqs) -> dict:
    """Each prompt's tokens once (its n choices are consecutive, ``h.choices_per_prompt`` of them), and
    every choice's generated tokens."""
    p = sum(len(r.prompt) for r in reqs[:: h.choices_per_prompt])
    c = sum(len(r.output) for r in reqs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _prompt_text(text, r) -> str:
    return text.decode(r.prompt, skip_special_tokens=False) if text.tok is not None else ""


def _head(h, rid: str, created: int, obj: str) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": h.server.model_name}


def _texts(deltas, n: int) -> list[str]:
    """Each choice's whole text from its deltas."""
    parts: dict[int, list[str]] = defaultdict(list)
    for d in deltas:
        parts[d.index].append(d.text)
    return ["".join(parts[i]) for i in range(n)]


def split_reply(text: str, harmony: bool) -> tuple[str | None, str]:
    """(reasoning or None, content) of a chat reply."""
    if not harmony:
        return None, text
    reasoning, content = split_harmony(text)
    return reasoning or None, content


def completion_response(h, rid: str, created: int, reqs, deltas, echo: bool) -> str:
    text = h.server.text
    choices = []
    for i, (r, body) in enumerate(zip(reqs, _texts(deltas, len(reqs)))):
        prefix = _prompt_text(text, r) if echo else ""
        lp = None
        if r.params.logprobs is not None:
            entries = (r.prompt_logprobs if echo else []) + r.logprobs
            tokens = (r.prompt if echo else []) + r.output[: len(r.logprobs)]
            lp = completion_logprobs(entries, tokens, text.token_str, 0)
        choices.append({"index": i, "text": prefix + body, "logprobs": lp, "finish_reason": r.finish_reason, "stop_reason": r.stop_reason})
    return render(CompletionResponse, {**_head(h, rid, created, "text_completion"), "choices": choices, "usage": _usage(h, reqs)})


async def completion_chunks(h, rid: str, created: int, reqs, deltas: AsyncIterator, echo: bool, usage: bool) -> AsyncIterator[str]:
    text, head = h.server.text, _head(h, rid, created, "text_completion")
    offsets = [0] * len(reqs)
    if echo:
        for i, r in enumerate(reqs):
            s = _prompt_text(text, r)
            lp = None
            if r.params.prompt_logprobs is not None:
                lp = completion_logprobs(r.prompt_logprobs or [None], r.prompt, text.token_str, 0)
                offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1]) if lp["tokens"] else 0
            yield render(CompletionResponse, {**head, "choices": [{"index": i, "text": s, "logprobs": lp, "finish_reason": None}]})
    async for d in deltas:
        lp = None
        if reqs[d.index].params.logprobs is not None and d.logprobs:
            lp = completion_logprobs(d.logprobs, d.tokens, text.token_str, offsets[d.index])
            offsets[d.index] = lp["text_offset"][-1] + len(lp["tokens"][-1])
        c = {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason}
        if d.finish_reason is not None:
            c["stop_reason"] = d.stop_reason
        yield render(CompletionResponse, {**head, "choices": [c]})
    if usage:
        yield render(CompletionResponse, {**head, "choices": [], "usage": _usage(h, reqs)})


def chat_response(h, rid: str, created: int, reqs, deltas, harmony: bool) -> str:
    text = h.server.text
    choices = []
    for i, (r, reply) in enumerate(zip(reqs, _texts(deltas, len(reqs)))):
        reasoning, content = split_reply(reply, harmony)
        msg = {"role": "assistant", "content": content}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        lp = {"content": chat_logprobs(r.logprobs, text.token_str)} if r.params.logprobs is not None else None
        choices.append({"index": i, "message": msg, "logprobs": lp, "finish_reason": r.finish_reason, "stop_reason": r.stop_reason})
    return render(ChatResponse, {**_head(h, rid, created, "chat.completion"), "choices": choices, "usage": _usage(h, reqs)})


async def chat_chunks(h, rid: str, created: int, reqs, deltas: AsyncIterator, harmony: bool, usage: bool) -> AsyncIterator[str]:
    text, head = h.server.text, _head(h, rid, created, "chat.completion.chunk")
    raw = [""] * len(reqs)
    sent = [("", "") for _ in reqs]  # (reasoning, content) sent so far
    for i in range(len(reqs)):
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        yield render(ChatResponse, {**head, "choices": [first]})
    async for d in deltas:
        raw[d.index] += d.text
        reasoning, content = split_reply(raw[d.index], harmony)
        reasoning = reasoning or ""
        old_r, old_c = sent[d.index]
        delta = {}
        if reasoning.startswith(old_r) and len(reasoning) > len(old_r):
            delta["reasoning_content"], old_r = reasoning[len(old_r):], reasoning
        if content.startswith(old_c) and len(content) > len(old_c):
            delta["content"], old_c = content[len(old_c):], content
        sent[d.index] = (old_r, old_c)
        lp = None
        if reqs[d.index].params.logprobs is not None and d.logprobs:
            lp = {"content": chat_logprobs(d.logprobs, text.token_str)}
        if delta or lp is not None or d.finish_reason is not None:
            c = {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": d.finish_reason}
            if d.finish_reason is not None:
                c["stop_reason"] = d.stop_reason
            yield render(ChatResponse, {**head, "choices": [c]})
    if usage:
        yield render(ChatResponse, {**head, "choices": [], "usage": _usage(h, reqs)})
