"""Response bodies and stream chunks of the OpenAI completions and chat APIs, from engine deltas.

Choices are numbered prompt-major (``prompt_index * n + j``) as the OpenAI API numbers them.  Usage
counts each prompt once and every choice's generated tokens.  With ``echo`` the prompt's text (and,
with ``logprobs``, its per-token logprobs, the first one null) comes before the completion, the way
lm-eval-harness reads loglikelihoods.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from .protocol import chat_logprobs, completion_logprobs
from .text import split_harmony


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


def completion_response(h, rid: str, created: int, reqs, deltas, echo: bool) -> dict:
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
    return {**_head(h, rid, created, "text_completion"), "choices": choices, "usage": _usage(h, reqs)}


def completion_chunks(h, rid: str, created: int, reqs, deltas: Iterable, echo: bool, usage: bool) -> Iterator[dict]:
    text, head = h.server.text, _head(h, rid, created, "text_completion")
    offsets = [0] * len(reqs)
    if echo:
        for i, r in enumerate(reqs):
            s = _prompt_text(text, r)
            lp = None
            if r.params.prompt_logprobs is not None:
                lp = completion_logprobs(r.prompt_logprobs or [None], r.prompt, text.token_str, 0)
                offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1]) if lp["tokens"] else 0
            yield {**head, "choices": [{"index": i, "text": s, "logprobs": lp, "finish_reason": None}]}
    for d in deltas:
        lp = None
        if reqs[d.index].params.logprobs is not None and d.logprobs:
            lp = completion_logprobs(d.logprobs, d.tokens, text.token_str, offsets[d.index])
            offsets[d.index] = lp["text_offset"][-1] + len(lp["tokens"][-1])
        c = {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason}
        if d.finish_reason is not None:
            c["stop_reason"] = d.stop_reason
        yield {**head, "choices": [c]}
    if usage:
        yield {**head, "choices": [], "usage": _usage(h, reqs)}


def chat_response(h, rid: str, created: int, reqs, deltas, harmony: bool) -> dict:
    text = h.server.text
    choices = []
    for i, (r, reply) in enumerate(zip(reqs, _texts(deltas, len(reqs)))):
        reasoning, content = split_reply(reply, harmony)
        msg = {"role": "assistant", "content": content}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        lp = {"content": chat_logprobs(r.logprobs, text.token_str)} if r.params.logprobs is not None else None
        choices.append({"index": i, "message": msg, "logprobs": lp, "finish_reason": r.finish_reason, "stop_reason": r.stop_reason})
    return {**_head(h, rid, created, "chat.completion"), "choices": choices, "usage": _usage(h, reqs)}


def chat_chunks(h, rid: str, created: int, reqs, deltas: Iterable, harmony: bool, usage: bool) -> Iterator[dict]:
    text, head = h.server.text, _head(h, rid, created, "chat.completion.chunk")
    raw = [""] * len(reqs)
    sent = [("", "") for _ in reqs]  # (reasoning, content) sent so far
    for i in range(len(reqs)):
        yield {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}
    for d in deltas:
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
            yield {**head, "choices": [c]}
    if usage:
        yield {**head, "choices": [], "usage": _usage(h, reqs)}
