"""``quantkit serve``: an OpenAI-compatible HTTP server over :class:`.scheduler.LLMEngine`.

One engine thread owns the model and the KV cache and steps the continuous batch; HTTP handler
threads (the standard library's threading server) parse requests, hand them to the engine thread
and stream back what it produces.  Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``
(each with ``"stream": true`` as server-sent events), vLLM's ``POST /tokenize`` and ``/detokenize``,
``GET /v1/models``, ``GET /health``, ``GET /version``, ``GET /metrics`` (Prometheus text).  A client
that disconnects before its response is done has its requests aborted.
"""

from __future__ import annotations

import hmac
import json
import queue
import select
import socket
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import protocol as proto
from .sampling import SamplingParams, TokenLogprobs
from .scheduler import LLMEngine, Request, RequestError
from .text import ModelText

MAX_BODY = 64 << 20


@dataclass
class Delta:
    """What one request produced since the last delta."""

    index: int
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ClientGone(Exception):
    """The client closed its connection before its response was ready."""


class EngineLoop(threading.Thread):
    """The engine thread: takes submissions, steps while there is work, posts deltas to each caller."""

    def __init__(self, engine: LLMEngine) -> None:
        super().__init__(name="quantkit-engine", daemon=True)
        self.engine = engine
        self.inbox: queue.Queue = queue.Queue()
        self.sinks: dict[Request, tuple[int, queue.Queue, list[int]]] = {}  # request -> (index, out queue, [tokens sent])
        self.lock = threading.Lock()  # guards the stats /metrics reads

    def submit(self, items: list[tuple[int, list[int], SamplingParams, object]], out: queue.Queue) -> list[Request]:
        """Add requests (index, prompt ids, params, detokenizer); their deltas go to ``out``.  Raises
        RequestError before anything is queued when one of them cannot run."""
        done = threading.Event()
        box: dict = {}
        self.inbox.put(("add", items, out, done, box))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["requests"]

    def abort(self, requests: list[Request]) -> None:
        self.inbox.put(("abort", requests))

    def stop(self) -> None:
        self.inbox.put(("stop",))

    def _take(self, msg: tuple) -> None:
        if msg[0] == "add":
            _, items, out, done, box = msg
            try:
                for _, prompt, params, _ in items:  # check all before queuing any
                    self.engine.check_request(prompt, params)
                reqs = [self.engine.add_request(p, params, f"{uuid.uuid4().hex}-{i}", detok, checked=True) for i, p, params, detok in items]
                for (i, *_), r in zip(items, reqs):
                    self.sinks[r] = (i, out, [0])
                box["requests"] = reqs
            except RequestError as e:
                box["error"] = e
            except Exception as e:  # never let one request take the engine thread down
                traceback.print_exc(file=sys.stderr)
                box["error"] = RuntimeError(f"the engine could not take the request: {e}")
            done.set()
        elif msg[0] == "abort":
            for r in msg[1]:
                with self.lock:
                    self.engine.abort(r)
                self.sinks.pop(r, None)

    def run(self) -> None:
        try:
            self._loop()
        finally:  # stopped (or broken): requests still running end with an error, so their handlers return
            self._fail_all(RuntimeError("the server is shutting down"))

    def _loop(self) -> None:
        while True:
            try:  # block while idle; while there is work, only take what is already there
                msg = self.inbox.get() if not self.engine.has_work() else self.inbox.get_nowait()
            except queue.Empty:
                msg = None
            while msg is not None:
                if msg[0] == "stop":
                    return
                self._take(msg)
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    msg = None
            if not self.engine.has_work():
                continue
            try:
                with self.lock:
                    advanced = self.engine.step()
            except Exception as e:  # a failed step fails its requests, the server stays up
                traceback.print_exc(file=sys.stderr)
                self._fail_all(RuntimeError(f"the engine failed on this batch: {e}"))
                continue
            for r in advanced:
                self._post(r)

    def _post(self, r: Request) -> None:
        sink = self.sinks.get(r)
        if sink is None:
            return
        index, out, sent = sink
        d = Delta(index, r.detok.delta() if r.detok is not None else "", r.output[sent[0]:], r.logprobs[sent[0]:])
        sent[0] = len(r.output)
        if r.finished:  # the detokenizer was finished with the request: its delta above holds the rest
            d.finish_reason, d.stop_reason = r.finish_reason, r.stop_reason
            del self.sinks[r]
        if d.text or d.tokens or d.finish_reason:
            out.put(d)

    def _fail_all(self, e: Exception) -> None:
        for r in list(self.sinks):
            self.engine.abort(r)
            _, out, _ = self.sinks.pop(r)
            out.put(e)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: LLMEngine, text: ModelText, model_name: str) -> None:
        self._conns: dict[threading.Thread, object] = {}  # set first: a failed bind calls server_close
        self._conn_lock = threading.Lock()
        self._background: threading.Thread | None = None
        super().__init__(address, Handler)
        self.engine, self.text, self.model_name = engine, text, model_name
        self.loop = EngineLoop(engine)
        self.started = int(time.time())
        self.ctrl = None  # the control group of expert-parallel serving (rank 0 broadcasts each step on it)
        self.api_key: str | None = None  # when set, /v1/* asks for "Authorization: Bearer <key>"

    # Connections a client keeps open (HTTP/1.1 keep-alive) hold a handler thread in a read.  Closing
    # the server shuts them down and waits for those threads, so none wakes during interpreter exit.
    def process_request_thread(self, request, client_address) -> None:
        with self._conn_lock:
            self._conns[threading.current_thread()] = request
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self._conns.pop(threading.current_thread(), None)

    def server_close(self) -> None:
        super().server_close()
        with self._conn_lock:
            open_now = list(self._conns.items())
        for _, conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread, _ in open_now:
            thread.join(timeout=5)

    def serve(self) -> None:
        self.loop.start()
        try:
            self.serve_forever(poll_interval=0.1)
        finally:
            self.loop.stop()
            self.loop.join(timeout=30)
            if self.ctrl is not None:  # expert-parallel serving: release the other ranks
                from .distributed import stop_workers

                stop_workers(self.ctrl)

    def start_background(self) -> threading.Thread:
        """Serve from a background thread (tests, notebooks); :meth:`close` stops it."""
        t = self._background = threading.Thread(target=self.serve, name="quantkit-http", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        """Stop a background server and wait for it: the HTTP loop, then the engine thread (``serve``'s
        finally), then open connections.  No thread of it is left to run into interpreter exit."""
        if self._background is not None:  # shutdown() waits for serve_forever: only where it runs
            self.shutdown()
            self._background.join(timeout=60)
        self.server_close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:  # one line per request on stderr, as uvicorn's access log
        sys.stderr.write(f"{self.address_string()} - {fmt % args}\n")

    # --- plumbing --------------------------------------------------------------------------------
    def _send(self, status: int, body: dict | str, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, e: proto.ProtocolError) -> None:
        self._send(e.status, e.body())

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise proto.ProtocolError(f"request body of {n} bytes is larger than {MAX_BODY}")
        try:
            body = json.loads(self.rfile.read(n) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise proto.ProtocolError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise proto.ProtocolError("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.server.model_name:
            raise proto.ProtocolError(f"The model `{model}` does not exist (this server has `{self.server.model_name}`).", 404, "model")
        return body

    def _authorized(self) -> bool:
        """/v1/* with --api-key: the bearer token must match (vLLM's rule; /health, /metrics, /version stay open)."""
        key = self.server.api_key
        if key is None or not self.path.startswith("/v1/"):
            return True
        if hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {key}"):
            return True
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(401, {"error": {"message": "Unauthorized: a valid API key is needed", "type": "AuthenticationError",
                                   "param": None, "code": 401}})
        return False

    def do_GET(self) -> None:
        s = self.server
        if not self._authorized():
            return
        if self.path == "/health":
            return self._send(200 if s.loop.is_alive() else 503, "", "text/plain")
        if self.path == "/v1/models":
            card = {"id": s.model_name, "object": "model", "created": s.started, "owned_by": "quantkit",
                    "root": str(s.text.root), "max_model_len": s.engine.max_model_len}
            return self._send(200, {"object": "list", "data": [card]})
        if self.path == "/version":
            from .. import __version__

            return self._send(200, {"version": __version__})
        if self.path == "/metrics":
            from .metrics import render

            with s.loop.lock:
                text = render(s.engine, s.model_name)
            return self._send(200, text, "text/plain; version=0.0.4")
        self._error(proto.ProtocolError(f"no route GET {self.path}", 404))

    def do_POST(self) -> None:
        if not self._authorized():
            return
        routes = {"/v1/completions": self._completions, "/v1/chat/completions": self._chat, "/tokenize": self._tokenize,
                  "/detokenize": self._detokenize}
        if self.path not in routes:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return self._error(proto.ProtocolError(f"no route POST {self.path}", 404))
        try:
            routes[self.path](self._body())
        except proto.ProtocolError as e:
            self._error(e)
        except (RequestError, ValueError) as e:
            self._error(proto.ProtocolError(str(e)))
        except RuntimeError as e:
            self._error(proto.ProtocolError(str(e), 500))
        except ClientGone:
            self.close_connection = True

    def _tokenize(self, body: dict) -> None:
        """vLLM's ``/tokenize``: a ``prompt`` (text, encoded as completions encode it) or chat ``messages``."""
        t = self.server.text
        if "messages" in body:
            ids = t.encode_chat(proto.messages(body), add_generation_prompt=bool(body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            ids = t.encode(body["prompt"])
        else:
            raise proto.ProtocolError("'prompt' (a string) or 'messages' is needed", param="prompt")
        self._send(200, {"tokens": ids, "count": len(ids), "max_model_len": self.server.engine.max_model_len})

    def _detokenize(self, body: dict) -> None:
        ids = body.get("tokens")
        vocab = self.server.engine.vocab_size
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
            raise proto.ProtocolError(f"'tokens' must be a list of token ids in [0, {vocab})", param="tokens")
        self._send(200, {"prompt": self.server.text.decode(ids, skip_special_tokens=False)})

    # --- requests --------------------------------------------------------------------------------
    def _run(self, prompts: list[list[int]], params: SamplingParams, n: int, bounded: bool, detok) -> tuple[list, queue.Queue]:
        eng, items = self.server.engine, []
        for pi, ids in enumerate(prompts):
            p = proto.fit_max_tokens(params, bounded, len(ids), eng.max_model_len)
            for j in range(n):
                seed = None if p.seed is None else p.seed + j
                pj = p if seed == p.seed else replace(p, seed=seed)
                items.append((pi * n + j, ids, pj, detok(pj)))
        out: queue.Queue = queue.Queue()
        self.choices_per_prompt = n  # usage counts each prompt once (openai_io)
        return self.server.loop.submit(items, out), out

    def _client_gone(self) -> bool:
        """Whether the client closed its connection (readable with nothing to read); a request body it
        pipelines after this one counts as still there."""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _deltas(self, reqs: list[Request], out: queue.Queue):
        """The requests' deltas as the engine posts them.  A client that goes away while waiting for a
        whole response has its requests aborted (a stream notices when a write fails)."""
        left, checked = len(reqs), time.monotonic()
        while left:
            try:
                d = out.get(timeout=0.1)
            except queue.Empty:
                d = None
            if time.monotonic() - checked >= 0.1:  # deltas may come every step: look at the client on a clock
                checked = time.monotonic()
                if self._client_gone():
                    self.server.loop.abort([r for r in reqs if not r.finished])
                    raise ClientGone
            if d is None:
                continue
            if isinstance(d, Exception):
                raise RuntimeError(str(d))
            left -= d.finish_reason is not None
            yield d

    def _stream(self, reqs: list[Request], chunks) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for c in chunks:
                self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ClientGone):
            self.server.loop.abort([r for r in reqs if not r.finished])
        except RuntimeError as e:
            err = proto.ProtocolError(str(e), 500).body()
            self.wfile.write(f"data: {json.dumps(err)}\n\n".encode())

    def _completions(self, body: dict) -> None:
        from .openai_io import completion_chunks, completion_response

        s = self.server
        params, n, bounded = proto.sampling(body, chat=False)
        raw = proto.prompts(body)
        ids = [s.text.encode(p) if isinstance(p, str) else list(p) for p in raw]
        skip = bool(body.get("skip_special_tokens", True))
        reqs, out = self._run(ids, params, n, bounded, lambda p: s.text.detokenizer(p.stop, p.include_stop_str, skip))
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        echo = bool(body.get("echo", False))
        self._reply(body, reqs, out, lambda deltas, usage: completion_chunks(self, rid, created, reqs, deltas, echo, usage),
                    lambda deltas: completion_response(self, rid, created, reqs, deltas, echo))

    def _chat(self, body: dict) -> None:
        from .openai_io import chat_chunks, chat_response

        s = self.server
        params, n, bounded = proto.sampling(body, chat=True)
        kw = body.get("chat_template_kwargs") or {}
        if not isinstance(kw, dict):
            raise proto.ProtocolError("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
        ids = s.text.encode_chat(proto.messages(body), add_generation_prompt=True, **kw)
        harmony = s.text.harmony  # GPT-OSS: keep the channel markers to split reasoning from the answer
        reqs, out = self._run([ids], params, n, bounded, lambda p: s.text.detokenizer(p.stop, p.include_stop_str, not harmony))
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self._reply(body, reqs, out, lambda deltas, usage: chat_chunks(self, rid, created, reqs, deltas, harmony, usage),
                    lambda deltas: chat_response(self, rid, created, reqs, deltas, harmony))

    def _reply(self, body: dict, reqs: list[Request], out: queue.Queue, chunks, whole) -> None:
        """Stream ``chunks(deltas, include_usage)`` as server-sent events, or send ``whole(deltas)`` once all are in."""
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return self._stream(reqs, chunks(self._deltas(reqs, out), usage))
        try:
            deltas = list(self._deltas(reqs, out))
        except RuntimeError as e:
            return self._error(proto.ProtocolError(str(e), 500))
        self._send(200, whole(deltas))
