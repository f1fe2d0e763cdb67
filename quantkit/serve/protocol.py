"""The OpenAI request fields the server takes, checked, and the response pieces it writes.

Completions (``/v1/completions``): ``prompt`` (a string, a list of strings, a list of token ids, or
a list of lists of ids), ``max_tokens`` (default 16; null: up to the context length),
``temperature`` (1), ``top_p`` (1), ``n`` (1), ``stop``, ``seed``, ``logprobs`` (0-20), ``echo``,
``stream`` with ``stream_options.include_usage``; the vLLM extensions ``top_k``,
``stop_token_ids``, ``ignore_eos``, ``include_stop_str_in_output``, ``skip_special_tokens``.
Chat (``/v1/chat/completions``): ``messages`` and the same sampling fields, with ``max_tokens`` or
``max_completion_tokens``, ``logprobs`` (bool) and ``top_logprobs``.  Both take ``presence_penalty``,
``frequency_penalty``, ``logit_bias`` and vLLM's ``repetition_penalty`` and ``min_tokens``.  Fields the engine does not
implement (``best_of`` > n, ``suffix``, tools) are refused with a 400 naming them, never silently
ignored.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .sampling import MAX_LOGPROBS, SamplingParams, TokenLogprobs


class ProtocolError(ValueError):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> dict:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed"}.get(self.status, "InternalServerError")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.status}}


def _num(body: dict, name: str, default, kind=float, lo=None, hi=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()) or not math.isfinite(v):
        raise ProtocolError(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {v!r}", param=name)
    v = kind(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ProtocolError(f"'{name}' must be in [{lo}, {hi}], got {v}", param=name)
    return v


def _bias(body: dict) -> tuple[tuple[int, float], ...]:
    v = body.get("logit_bias") or {}
    if not isinstance(v, dict):
        raise ProtocolError("'logit_bias' must be an object of token id -> bias", param="logit_bias")
    out = []
    for k, b in v.items():
        try:
            t = int(k)
        except (TypeError, ValueError):
            raise ProtocolError(f"'logit_bias' key {k!r} is not a token id", param="logit_bias") from None
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise ProtocolError(f"'logit_bias' value for {k} must be a number", param="logit_bias")
        out.append((t, float(b)))
    return tuple(out)


def _unsupported(body: dict) -> None:
    if body.get("suffix"):
        raise ProtocolError("'suffix' is not supported by this server", param="suffix")
    if body.get("tools") or body.get("functions"):
        raise ProtocolError("tool calling is not supported by this server", param="tools")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise ProtocolError("'response_format' other than text is not supported by this server", param="response_format")


def _stop(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise ProtocolError("'stop' must be a non-empty string or a list of them", param="stop")
    return tuple(v)


def _ids(body: dict, name: str) -> tuple[int, ...]:
    v = body.get(name) or []
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise ProtocolError(f"'{name}' must be a list of token ids", param=name)
    return tuple(v)


def sampling(body: dict, *, chat: bool) -> tuple[SamplingParams, int, bool]:
    """(SamplingParams, n, bounded): ``bounded`` False when no max_tokens was given for a chat (or null was
    given): the server then lets the reply run to the context length (:func:`fit_max_tokens`)."""
    _unsupported(body)
    n = _num(body, "n", 1, int, 1, 16)
    best_of = _num(body, "best_of", n, int, 1, 16)
    if best_of != n:
        raise ProtocolError("'best_of' other than n is not supported by this server", param="best_of")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _num(body, key, None if chat else 16, int, 1 if chat else 0)
    if chat:
        if not isinstance(body.get("logprobs", False), bool):
            raise ProtocolError("'logprobs' must be true or false", param="logprobs")
        top = _num(body, "top_logprobs", 0, int, 0, MAX_LOGPROBS)
        logprobs = top if body.get("logprobs") else None
        if top and logprobs is None:
            raise ProtocolError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    else:
        logprobs = _num(body, "logprobs", None, int, 0, MAX_LOGPROBS)
    echo = bool(body.get("echo", False)) and not chat
    try:
        params = SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else _num(body, "min_tokens", 0, int), temperature=_num(body, "temperature", 1.0, float, 0, 2),
            top_p=_num(body, "top_p", 1.0), top_k=_num(body, "top_k", -1, int), seed=_num(body, "seed", None, int, -(2**63), 2**64 - 1),
            stop=_stop(body), stop_token_ids=_ids(body, "stop_token_ids"), ignore_eos=bool(body.get("ignore_eos", False)),
            logprobs=logprobs, prompt_logprobs=logprobs if (echo and logprobs is not None) else None,
            include_stop_str=bool(body.get("include_stop_str_in_output", False)),
            presence_penalty=_num(body, "presence_penalty", 0.0), frequency_penalty=_num(body, "frequency_penalty", 0.0),
            repetition_penalty=_num(body, "repetition_penalty", 1.0), logit_bias=_bias(body), min_tokens=_num(body, "min_tokens", 0, int))
    except ValueError as e:
        raise ProtocolError(str(e)) from None
    return params, n, max_tokens is not None


def fit_max_tokens(p: SamplingParams, bounded: bool, prompt_len: int, max_model_len: int) -> SamplingParams:
    """The params of one prompt: without a bound, max_tokens is what the context length leaves."""
    return p if bounded else replace(p, max_tokens=max(0, max_model_len - prompt_len))


def prompts(body: dict) -> list[str | list[int]]:
    """The completions ``prompt`` field as a list of text or token-id prompts."""
    p = body.get("prompt")
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return [p]
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in p):
            return list(p)
    raise ProtocolError("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids", param="prompt")


def messages(body: dict) -> list[dict]:
    """Chat ``messages`` with each content flattened to text (text parts joined)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ProtocolError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ProtocolError(f"messages[{i}] must be an object with a 'role'", param="messages")
        c = m.get("content")
        if isinstance(c, list):
            if not all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str) for x in c):
                raise ProtocolError(f"messages[{i}].content: only text parts are supported", param="messages")
            c = "".join(x["text"] for x in c)
        elif c is None:
            c = ""
        elif not isinstance(c, str):
            raise ProtocolError(f"messages[{i}].content must be a string or a list of text parts", param="messages")
        out.append({**m, "content": c})
    return out


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
