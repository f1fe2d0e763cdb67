"""The FastAPI application: the OpenAI routes, vLLM's tokenizer routes, health, models, version, metrics.

Handlers run on the front's event loop and never block it: parsing, encoding and checking a request run in
a worker thread, the engine in its own process (:mod:`.client` talks to it).  Every failure is one
OpenAI error body: the client's mistakes a 400 (404 for another model), a full waiting queue a 503
with ``Retry-After``, the engine's failures a 500; anything unexpected is logged and a 500 too.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, replace
from functools import wraps

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from .. import openai_io as io
from .. import protocol as proto
from ..request import RequestError
from .client import Sink
from .engine_loop import Busy
from .streaming import ClientGone, collect, sse

JSON = "application/json"


@dataclass
class Reply:
    """What the response writers read (:mod:`..openai_io`): the server and how many choices each prompt has."""

    server: object
    choices_per_prompt: int


def _answers(fn):
    """A route whose every failure is one OpenAI error response."""

    @wraps(fn)
    async def route(request: Request) -> Response:
        try:
            return await fn(request)
        except proto.ProtocolError as e:
            return JSONResponse(e.body(), e.status, headers=e.headers)
        except Busy as e:
            return JSONResponse(proto.error_body(str(e), 503), 503, headers={"Retry-After": "1"})
        except (RequestError, ValueError) as e:  # the engine's and the text layer's refusals
            return JSONResponse(proto.error_body(str(e), 400), 400)
        except ClientGone:
            return Response(status_code=499)  # no one reads it: the connection is gone
        except Exception as e:  # a bug must not leave the client without an answer
            traceback.print_exc(file=sys.stderr)
            return JSONResponse(proto.error_body(f"internal error: {type(e).__name__}: {e}", 500), 500)

    return route


def create_app(server) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    s = server

    def prepare(body: bytes, model: type) -> object:
        req = proto.parse(model, body)
        if req.model is not None and req.model != s.model_name:
            raise proto.ProtocolError(f"The model `{req.model}` does not exist (this server has `{s.model_name}`).", 404, "model")
        return req

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if s.loop.is_alive() else 503)

    @app.get("/version")
    async def version() -> Response:
        from ... import __version__

        return JSONResponse({"version": __version__})

    @app.get("/v1/models")
    async def models() -> Response:
        card = {"id": s.model_name, "object": "model", "created": s.started, "owned_by": "quantkit",
                "root": str(s.text.root), "max_model_len": s.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def metrics() -> Response:
        if not s.loop.is_alive():
            return JSONResponse(proto.error_body("the engine has stopped", 503), 503)
        text = await s.loop.metrics(s.model_name)  # read by the engine thread between two steps
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/tokenizer_info")
    @_answers
    async def tokenizer_info(request: Request) -> Response:
        return JSONResponse(s.text.tokenizer_info(s.max_model_len))

    @app.post("/tokenize")
    @_answers
    async def tokenize(request: Request) -> Response:
        def work(body: bytes) -> list[int]:
            req = prepare(body, proto.TokenizeRequest)
            if req.messages is not None:
                return s.text.encode_chat(req.messages, s.limits.max_tokens_per_request, add_generation_prompt=req.add_generation_prompt)
            if req.prompt is None:
                raise proto.ProtocolError("'prompt' (a string) or 'messages' is needed", param="prompt")
            return s.text.encode(req.prompt, add_special_tokens=req.add_special_tokens, limit=s.limits.max_tokens_per_request)

        ids = await asyncio.to_thread(work, await request.body())
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": s.max_model_len})

    @app.post("/detokenize")
    @_answers
    async def detokenize(request: Request) -> Response:
        req = prepare(await request.body(), proto.DetokenizeRequest)
        vocab = s.vocab_size  # the config's: a TP rank's embed_tokens holds only its slice
        if not all(0 <= i < vocab for i in req.tokens):
            raise proto.ProtocolError(f"'tokens' must be a list of token ids in [0, {vocab})", param="tokens")
        return JSONResponse({"prompt": s.text.decode(req.tokens, skip_special_tokens=False)})

    @app.post("/v1/completions")
    @_answers
    async def completions(request: Request) -> Response:
        def work(body: bytes):
            req = prepare(body, proto.CompletionRequest)
            params, n, bounded = proto.sampling(req)
            cap = s.limits.max_tokens_per_request
            ids = [s.text.encode(p, limit=cap) if isinstance(p, str) else list(p) for p in req.prompts()]
            detok = lambda p: detokenizer(p.stop, p.include_stop_str, req.skip_special_tokens)  # noqa: E731
            return req, items(ids, params, n, bounded, detok)

        req, batch = await asyncio.to_thread(work, await request.body())
        rid, created, echo = f"cmpl-{uuid.uuid4().hex}", int(time.time()), req.echo
        return await reply(request, req, batch,
                           lambda h, reqs, deltas, usage: io.completion_chunks(h, rid, created, reqs, deltas, echo, usage),
                           lambda h, reqs, deltas: io.completion_response(h, rid, created, reqs, deltas, echo))

    @app.post("/v1/chat/completions")
    @_answers
    async def chat(request: Request) -> Response:
        harmony = s.text.harmony  # GPT-OSS: keep the channel markers to split reasoning from the answer

        def work(body: bytes):
            req = prepare(body, proto.ChatRequest)
            params, n, bounded = proto.sampling(req)
            ids = s.text.encode_chat(req.messages, s.limits.max_tokens_per_request, add_generation_prompt=True, **req.template_kwargs())
            detok = lambda p: detokenizer(p.stop, p.include_stop_str, not harmony)  # noqa: E731
            return req, items([ids], params, n, bounded, detok)

        req, batch = await asyncio.to_thread(work, await request.body())
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        return await reply(request, req, batch,
                           lambda h, reqs, deltas, usage: io.chat_chunks(h, rid, created, reqs, deltas, harmony, usage),
                           lambda h, reqs, deltas: io.chat_response(h, rid, created, reqs, deltas, harmony))

    def detokenizer(stop: tuple[str, ...], include_stop_str: bool, skip_special_tokens: bool) -> tuple:
        """(the engine's detokenizer settings, this side's detokenizer): a sequence with stop strings is detokenized
        by the engine, which stops on them; any other here, off the engine's thread.  (None, None): no text."""
        d = s.text.detokenizer(stop, include_stop_str, skip_special_tokens)  # stop strings without a tokenizer raise
        if d is None or not stop:
            return None, d
        return (tuple(stop), include_stop_str, skip_special_tokens), None

    def items(prompts: list[list[int]], params, n: int, bounded: bool, detok) -> tuple[list, int]:
        """The engine's submissions of one request (prompt-major, choice j of a prompt seeded seed + j), within
        the per-request caps."""
        lim = s.limits
        if len(prompts) * n > lim.max_seqs_per_request:
            raise proto.ProtocolError(f"this request asks for {len(prompts) * n} sequences (prompts x n), more than this "
                                      f"server's limit of {lim.max_seqs_per_request} per request")
        out, tokens = [], 0
        for pi, ids in enumerate(prompts):
            p = proto.fit_max_tokens(params, bounded, len(ids), s.max_model_len)
            tokens += n * (len(ids) + p.max_tokens)
            for j in range(n):
                pj = p if p.seed is None or j == 0 else replace(p, seed=proto.choice_seed(p.seed, j))
                out.append((pi * n + j, ids, pj, *detok(pj)))
        if tokens > lim.max_tokens_per_request:
            raise proto.ProtocolError(f"this request asks for {tokens} tokens (prompt + max_tokens over its sequences), more "
                                      f"than this server's limit of {lim.max_tokens_per_request} per request")
        return out, n

    async def reply(request: Request, req, batch, chunks, whole) -> Response:
        (submissions, n), sink = batch, Sink()
        reqs = await s.loop.submit(submissions, sink)
        h = Reply(s, n)
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            events = sse(reqs, lambda deltas: chunks(h, reqs, deltas, usage), sink, s.loop)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        deltas = await collect(reqs, sink, request.receive, s.loop)
        return Response(whole(h, reqs, deltas), media_type=JSON)

    return app


def routes(app: FastAPI) -> dict[str, set[str]]:
    """path -> the methods the app answers there (what :class:`.limits.Guard` lets through)."""
    out: dict[str, set[str]] = {}
    for r in app.routes:
        out.setdefault(r.path, set()).update(getattr(r, "methods", ()) or ())
    return out
