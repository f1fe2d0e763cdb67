"""The OpenAI request bodies the server takes (pydantic models, vLLM's ``protocol.py`` field names) and
their conversion to :class:`.sampling.SamplingParams`.

Completions (``/v1/completions``): ``prompt`` (a string, a list of strings, a list of token ids, or
a list of lists of ids), ``max_tokens`` (default 16; null: up to the context length),
``temperature`` (1), ``top_p`` (1), ``n`` (1), ``stop``, ``seed``, ``logprobs`` (0-20), ``echo``,
``stream`` with ``stream_options.include_usage``; the vLLM extensions ``top_k``,
``stop_token_ids``, ``ignore_eos``, ``include_stop_str_in_output``, ``skip_special_tokens``.
Chat (``/v1/chat/completions``): ``messages`` and the same sampling fields, with ``max_tokens`` or
``max_completion_tokens``, ``logprobs`` (bool) and ``top_logprobs``.  Both take ``presence_penalty``,
``frequency_penalty``, ``logit_bias`` and vLLM's ``repetition_penalty`` and ``min_tokens``.  Fields the
engine does not implement (``best_of`` > n, ``suffix``, tools) are refused with a 400 naming them, never
silently ignored; fields no one here knows are ignored, as vLLM ignores them.

Bodies are parsed by pydantic's own JSON reader: invalid UTF-8, lone surrogates, ``NaN`` and numbers
beyond a float are a 400 naming the field, never an exception inside the server.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .sampling import MAX_LOGPROBS, SamplingParams
from .text import TEMPLATE_VARIABLES


class ProtocolError(ValueError):
    """A request the server answers with ``status`` and the OpenAI error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.headers = status, param, headers or {}

    def body(self) -> dict:
        return error_body(str(self), self.status, self.param)


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowed",
               408: "RequestTimeout", 413: "RequestTooLarge", 503: "ServiceUnavailable"}


def error_body(message: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "InternalServerError"), "param": param, "code": status}}


_KINDS = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer", "float_type": "a number",
          "float_parsing": "a number", "finite_number": "a finite number", "bool_type": "true or false",
          "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list", "dict_type": "an object",
          "model_type": "an object", "model_attributes_type": "an object"}


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def explain(e: ValidationError) -> ProtocolError:
    """The first problem pydantic found, as one 400 that names the field (its input cut to 40 characters)."""
    err = e.errors(include_url=False)[0]
    where, kind = _where(err["loc"]), err["type"]
    if kind == "json_invalid":
        return ProtocolError(f"the request body is not valid JSON: {err['msg'].removeprefix('Invalid JSON: ')}")
    if kind == "value_error":
        return ProtocolError(str(err["ctx"]["error"]), param=where.split(".")[0] or None)
    if kind == "missing":
        return ProtocolError(f"'{where}' is required", param=where)
    shown = _cut(err.get("input"))
    what, name = _KINDS.get(kind), f"'{where}'" if where else "the request body"
    return ProtocolError(f"{name} must be {what}, got {shown}" if what else f"{name}: {err['msg']}", param=where or None)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """A request body (JSON bytes) as ``model``, or the ProtocolError that says what is wrong."""
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as e:
        raise explain(e) from None


def _in(name: str, v, lo, hi=None):
    if v is not None and not (lo <= v and (hi is None or v <= hi)):
        rule = f"in [{lo}, {hi}]" if hi is not None else f"at least {lo}"
        raise ProtocolError(f"'{name}' must be {rule}, got {_cut(v)}", param=name)
    return v


def _cut(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """The fields completions and chat share."""

    model: str | None = None
    n: int = 1
    best_of: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: Any = None
    tools: Any = None
    functions: Any = None
    response_format: Any = None

    def unsupported(self) -> None:
        if self.suffix:
            raise ProtocolError("'suffix' is not supported by this server", param="suffix")
        if self.tools or self.functions:
            raise ProtocolError("tool calling is not supported by this server", param="tools")
        if self.response_format not in (None, {"type": "text"}):
            raise ProtocolError("'response_format' other than text is not supported by this server", param="response_format")

    def stops(self) -> tuple[str, ...]:
        v = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if not all(v):
            raise ProtocolError("'stop' must be a non-empty string or a list of them", param="stop")
        return tuple(v)

    def bias(self) -> tuple[tuple[int, float], ...]:
        out = []
        for k, b in (self.logit_bias or {}).items():
            try:
                out.append((int(k), b))
            except ValueError:
                raise ProtocolError(f"'logit_bias' key {k[:40]!r} is not a token id", param="logit_bias") from None
        return tuple(out)


class CompletionRequest(_Sampling):
    prompt: Any = None
    echo: bool = False
    logprobs: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """The ``prompt`` field as a list of text or token-id prompts."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p, list) and p:
            if all(_is_id(x) for x in p):
                return [p]
            if all(isinstance(x, str) for x in p):
                return list(p)
            if all(isinstance(x, list) and x and all(_is_id(t) for t in x) for x in p):
                return list(p)
        raise ProtocolError("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids",
                            param="prompt")


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class ChatRequest(_Sampling):
    messages: list[Any]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _texts(cls, msgs: list) -> list[dict]:
        return flatten_messages(msgs)

    def template_kwargs(self) -> dict:
        """``chat_template_kwargs``, without the variables the server itself gives the template."""
        kw = self.chat_template_kwargs or {}
        taken = sorted(set(kw) & set(TEMPLATE_VARIABLES))
        if taken:
            raise ProtocolError(f"'chat_template_kwargs' cannot set {', '.join(taken)}: the server sets them", param="chat_template_kwargs")
        return kw


def flatten_messages(msgs: list) -> list[dict]:
    """Chat ``messages`` with each content flattened to text (text parts joined)."""
    if not msgs:
        raise ValueError("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a 'role'")
        c = m.get("content")
        if isinstance(c, list):
            if not all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str) for x in c):
                raise ValueError(f"messages[{i}].content: only text parts are supported")
            c = "".join(x["text"] for x in c)
        elif c is None:
            c = ""
        elif not isinstance(c, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({**m, "content": c})
    return out


class TokenizeRequest(_Body):
    """vLLM's ``/tokenize``: a ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Any] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @field_validator("messages")
    @classmethod
    def _texts(cls, msgs: list | None) -> list[dict] | None:
        return None if msgs is None else flatten_messages(msgs)


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def sampling(req: CompletionRequest | ChatRequest) -> tuple[SamplingParams, int, bool]:
    """(SamplingParams, n, bounded): ``bounded`` False when no max_tokens was given for a chat (or null was
    given): the server then lets the reply run to the context length (:func:`fit_max_tokens`)."""
    chat = isinstance(req, ChatRequest)
    req.unsupported()
    n = _in("n", req.n, 1, 16)
    if req.best_of is not None and req.best_of != n:
        raise ProtocolError("'best_of' other than n is not supported by this server", param="best_of")
    key, max_tokens = "max_tokens", req.max_tokens
    if chat and req.max_completion_tokens is not None:
        key, max_tokens = "max_completion_tokens", req.max_completion_tokens
    elif not chat and max_tokens is None and "max_tokens" not in req.model_fields_set:
        max_tokens = 16
    _in(key, max_tokens, 1 if chat else 0)
    if chat:
        top = _in("top_logprobs", req.top_logprobs or 0, 0, MAX_LOGPROBS)
        if top and not req.logprobs:
            raise ProtocolError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        logprobs = top if req.logprobs else None
    else:
        logprobs = _in("logprobs", req.logprobs, 0, MAX_LOGPROBS)
    echo = not chat and req.echo
    min_tokens = req.min_tokens or 0
    try:
        params = SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else min_tokens,
            temperature=_in("temperature", 1.0 if req.temperature is None else req.temperature, 0, 2),
            top_p=1.0 if req.top_p is None else req.top_p, top_k=-1 if req.top_k is None else req.top_k,
            seed=_in("seed", req.seed, -(2**63), 2**64 - 1), stop=req.stops(), stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos, logprobs=logprobs, prompt_logprobs=logprobs if echo and logprobs is not None else None,
            include_stop_str=req.include_stop_str_in_output, presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=req.bias(), min_tokens=min_tokens)
    except ValueError as e:
        raise ProtocolError(str(e)) from None
    return params, n, max_tokens is not None


def choice_seed(seed: int | None, j: int) -> int | None:
    """The seed of choice j of a request seeded ``seed``: seed + j, wrapped within the 64 bits a generator takes
    (``seed: 2**64 - 1, n: 2`` made a seed one past them, and a 500)."""
    if seed is None:
        return None
    s = seed + j
    return s - 2**64 if s >= 2**64 else s


def fit_max_tokens(p: SamplingParams, bounded: bool, prompt_len: int, max_model_len: int) -> SamplingParams:
    """The params of one prompt: without a bound, max_tokens is what the context length leaves."""
    return p if bounded else replace(p, max_tokens=max(0, max_model_len - prompt_len))
