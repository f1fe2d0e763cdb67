"""The server's limits, from raw sockets on loopback: a body too large, a missing API key or an unknown
path is refused from the request head alone (the body is never sent, so it cannot have been read)
and the connection closed, so nothing after the head is answered as a request of its own; slow
heads and bodies are cut at their deadlines with a 408; a client still sending when the server
closes reads its answer (a lingering close, never a reset); a connection past the cap gets a 503;
hundreds of clients connecting at once are all answered; per-request caps and a full waiting queue get their clear errors; malformed values
get a 400 with the OpenAI error body; non-finite numbers never reach JSON."""

from __future__ import annotations

import json
import select
import socket
import time

import pytest
import torch

from quantkit.serve.launch import build
from quantkit.serve.server import Limits

from .test_http import call

LIMITS = Limits(max_body_bytes=1 << 20, header_timeout_s=0.5, body_timeout_s=0.5, max_seqs_per_request=8,
                max_tokens_per_request=2000, max_waiting_seqs=2)


@pytest.fixture(scope="module")
def server(ckpt):
    s = build(str(ckpt("qwen3")), port=0, dtype="float32", act_quant=False, max_model_len=256, kv_cache_gib=0.01,
              max_num_batched_tokens=16, block_size=8, limits=LIMITS)
    s.start_background()
    yield s
    s.close()


def exchange(s, raw: bytes, wait: float = 10) -> bytes:
    """Send ``raw`` on a new connection and read until the server closes it (or ``wait`` s pass)."""
    with socket.create_connection(s.server_address, timeout=wait) as sock:
        sock.sendall(raw)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except TimeoutError:
            raise AssertionError(f"the server kept the connection open; it sent {got[:200]!r}") from None
    return got


def responses(got: bytes) -> list[tuple[int, dict | str]]:
    """(status, JSON body or text) of each HTTP response in ``got``."""
    out = []
    while got:
        head, _, rest = got.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        body, got = rest[:length], rest[length:]
        out.append((status, json.loads(body) if b"application/json" in head.lower() else body.decode()))
    return out


def post(path: str, headers: str, body: bytes = b"") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n".encode() + body


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_large_body_is_refused_from_its_header_before_auth_and_routing(server):
    server.api_key = "k"
    try:
        for path in ("/v1/completions", "/nowhere", "/tokenize"):  # over the limit: 413 whatever the path, key or not
            ((status, body),) = responses(exchange(server, post(path, f"Content-Length: {(1 << 20) + 1}\r\n")))
            assert status == 413 and "larger than this server's limit" in body["error"]["message"] and body["error"]["code"] == 413
    finally:
        server.api_key = None


def test_auth_and_unknown_paths_are_answered_before_the_body(server):
    """The head declares 1 MiB and no byte of it is sent: an answer that arrives proves the body was not read;
    the connection then closes, since the bytes that would follow are that body."""
    server.api_key = "k"
    try:
        for path, status in (("/v1/completions", 401), ("/v1/nowhere", 401), ("/nowhere", 404), ("/health", 405)):
            ((got, body),) = responses(exchange(server, post(path, f"Content-Length: {1 << 20}\r\n")))
            assert got == status and body["error"]["code"] == status
    finally:
        server.api_key = None


@pytest.mark.parametrize("header,status", [(f"Content-Length: {(1 << 20) + 1}", 413), ("Content-Length: abc", 400),
                                           ("Content-Length: -1", 400), ("Content-Length: 5\r\nContent-Length: 6", 400),
                                           ("Content-Length: 17\r\nTransfer-Encoding: chunked", 400)])
def test_a_request_hidden_after_a_refused_head_is_not_answered(server, header, status):
    got = responses(exchange(server, post("/v1/completions", header + "\r\n") + HEALTH))
    assert [g[0] for g in got] == [status] and got[0][1]["error"]["code"] == status


def test_a_slow_head_or_body_is_cut_at_its_deadline(server):
    t, got = time.monotonic(), b""
    with socket.create_connection(server.server_address, timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        while not got and time.monotonic() - t < 5:  # a header byte every 0.1 s does not extend the 0.5 s deadline
            sock.sendall(b"X")
            if select.select([sock], [], [], 0.1)[0]:
                got = sock.recv(4096)
        waited = time.monotonic() - t
        ((status, body),) = responses(got)
        assert status == 408 and "no whole request head arrived within 0.5 s" in body["error"]["message"]
        assert sock.recv(100) == b""  # then the server's FIN: the X bytes sent meanwhile were drained, not parsed
    assert 0.5 <= waited < 2
    ((status, body),) = responses(exchange(server, post("/v1/completions", "Content-Length: 100\r\n", b'{"prompt": ')))
    assert status == 408 and "did not arrive within 0.5 s" in body["error"]["message"]


def test_a_request_sent_after_the_head_deadline_gets_a_408_not_a_reset(server):
    """A client whose request comes late (its packets retransmitted after a full accept queue, its process
    stalled) reads a 408.  Before, the server closed the connection silently at its deadline, and the late
    request met an EOF or, landing on the closed socket first, a reset."""
    with socket.create_connection(server.server_address, timeout=10) as sock:
        time.sleep(0.8)
        sock.sendall(post("/v1/completions", "Content-Length: 2\r\n", b"{}"))
        time.sleep(0.2)  # the request has reached the server's socket before the client reads
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    ((status, body),) = responses(got)
    assert status == 408 and body["error"]["code"] == 408


def test_a_refusal_reaches_a_client_still_sending_its_body(server):
    """A client sends its whole 4 MiB body (as clients without ``Expect: 100-continue`` do) while the server
    refuses it from the head: an asyncio client reads the 413.  Before the lingering close it got
    ConnectionResetError (3 of 3 runs): the kernel resets a socket closed with unread bytes."""
    import asyncio

    async def send_all() -> bytes:
        reader, writer = await asyncio.open_connection(*server.server_address)
        writer.write(post("/v1/completions", f"Content-Length: {4 << 20}\r\n", b"x" * (4 << 20)))
        try:
            await writer.drain()  # the whole body sent before the answer is read, as HTTP clients do
            return await reader.readuntil(b"\r\n\r\n")
        finally:
            writer.close()

    head = asyncio.run(send_all())
    assert head.startswith(b"HTTP/1.1 413 ") and b"connection: close" in head.lower()


def test_a_connection_past_the_cap_gets_a_503_at_once(ckpt):
    """With 3 connections open (the cap), a 4th is answered 503 with Retry-After before it sends anything, then
    closed; once one of the 3 closes, a new connection is served."""
    lim = Limits(header_timeout_s=30, max_connections=3)
    s = build(str(ckpt("qwen3")), port=0, dtype="float32", act_quant=False, max_model_len=64, kv_cache_gib=0.01, limits=lim)
    s.start_background()
    try:
        held = [socket.create_connection(s.server_address, timeout=10) for _ in range(3)]
        held[0].sendall(HEALTH)
        assert held[0].recv(4096).startswith(b"HTTP/1.1 200")  # the 3 are in (served in order of connecting)
        with socket.create_connection(s.server_address, timeout=10) as sock:
            got = sock.recv(4096)
            sock.sendall(HEALTH)  # drained, never answered: the connection closes after the 503
            while chunk := sock.recv(4096):
                got += chunk
        ((status, body),) = responses(got)
        assert status == 503 and b"retry-after: 1" in got.lower() and "3 connections open, its limit" in body["error"]["message"]
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:  # the server sees the close when its event loop reads the EOF
            got = exchange(s, HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            if got.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert got.startswith(b"HTTP/1.1 200"), got[:100]
        for h in held:
            h.close()
    finally:
        s.close()


def test_the_open_file_limit_is_raised_to_hold_the_connections(monkeypatch):
    import resource

    from quantkit.serve import server as srv

    set_to = []
    monkeypatch.setattr(resource, "setrlimit", lambda what, limits: set_to.append(limits))
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 4096))
    srv._allow_open_files(3000)  # the soft limit goes up to the hard one
    assert set_to == [(4096, 4096)]
    monkeypatch.setattr(resource, "getrlimit", lambda what: (4096, 4096))
    srv._allow_open_files(3000)  # already there: left alone
    assert len(set_to) == 1
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 2048))
    with pytest.raises(ValueError, match=r"2000 connections \(--max-connections\) need 2256 open files, more than this "
                                         r"process's hard limit of 2048"):
        srv._allow_open_files(2000)
    assert len(set_to) == 1


def test_hundreds_of_clients_connecting_at_once_are_all_answered(server):
    socks = [socket.create_connection(server.server_address, timeout=30) for _ in range(300)]
    try:
        for s in socks:
            s.sendall(HEALTH)
        got = [s.recv(4096) for s in socks]
    finally:
        for s in socks:
            s.close()
    assert all(g.startswith(b"HTTP/1.1 200") for g in got)


def test_request_caps(server):
    status, r = call(server, "/v1/completions", {"prompt": ["a", "b", "c"], "n": 3, "max_tokens": 1})
    assert status == 400 and "asks for 9 sequences (prompts x n), more than this server's limit of 8" in r["error"]["message"]
    status, r = call(server, "/v1/completions", {"prompt": [[5] * 150] * 4, "n": 2, "max_tokens": 101})  # 8 x 251
    assert status == 400 and "asks for 2008 tokens (prompt + max_tokens over its sequences), more than this server's " \
                             "limit of 2000" in r["error"]["message"]


def test_a_long_text_is_refused_before_it_is_encoded_whole(server):
    """Over 2000 tokens (the cap per request, as one whole encoding counts them): refused, counted in pieces;
    just under it, the same ids as one encoding."""
    big = "hello world " * 3000
    assert len(server.text.encode(big)) > 2000
    for path, body in (("/tokenize", {"prompt": big}), ("/v1/completions", {"prompt": big, "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": big}]})):
        status, r = call(server, path, body)
        assert status == 400 and "the prompt has more than 2000 tokens" in r["error"]["message"], path
    text = "hello world " * 100
    while len(server.text.encode(text + "hello world ")) <= 2000:
        text += "hello world "
    status, r = call(server, "/tokenize", {"prompt": text})
    assert status == 200 and r["tokens"] == server.text.encode(text)


def test_a_full_waiting_queue_is_a_503_with_retry_after(server, monkeypatch):
    """With the engine held (its steps admit nothing), a request of 2 sequences fills the queue of 2: the next
    request gets a 503 with Retry-After, and once the engine goes on the first one is served."""
    import threading
    import urllib.request

    held, real = threading.Event(), server.engine.step
    held.set()

    def step():
        if held.is_set():
            time.sleep(0.01)
            return []
        return real()

    monkeypatch.setattr(server.engine, "step", step)
    first = {}
    t = threading.Thread(target=lambda: first.update(r=call(server, "/v1/completions", {"prompt": "x", "n": 2, "max_tokens": 2})))
    t.start()
    while len(server.engine.waiting) < 2:
        time.sleep(0.01)
    req = urllib.request.Request(server.url + "/v1/completions", json.dumps({"prompt": "y", "max_tokens": 1}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 503 and e.value.headers["Retry-After"] == "1"
    assert "2 sequences are waiting for admission (at most 2)" in json.loads(e.value.read())["error"]["message"]
    held.clear()
    t.join(timeout=60)
    assert first["r"][0] == 200 and len(first["r"][1]["choices"]) == 2


@pytest.mark.parametrize("path,raw,needle", [
    ("/v1/completions", '{"prompt": "a\\ud800b"}', "not valid JSON"),  # a lone surrogate
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}]}', "not valid JSON"),
    ("/tokenize", '{"prompt": "\\ud800"}', "not valid JSON"),
    ("/v1/completions", '{"prompt": [1, 2], "temperature": %d}' % 10**400, "'temperature' must be a finite number"),
    ("/v1/completions", '{"prompt": [1, 2], "seed": %d}' % 10**400, "'seed' must be in"),
    ("/v1/completions", '{"prompt": [1, 2], "max_tokens": %d}' % 10**400, "more than this server's limit"),
    ("/v1/completions", '{"prompt": [%d]}' % 10**400, "outside the vocabulary"),
    ("/v1/completions", '{"prompt": [1, 2], "top_p": NaN}', "'top_p' must be a finite number"),
    ("/v1/completions", '{"prompt": [1, 2], "stream": true, "stream_options": []}', "'stream_options' must be an object"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": 1}}',
     "'chat_template_kwargs' cannot set messages"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": '
     '{"add_generation_prompt": false}}', "cannot set add_generation_prompt"),
    ("/v1/completions", '[1, 2]', "the request body must be an object"),
    ("/v1/completions", '{"prompt": "x", "n": true, "n": "many"}', "'n' must be an integer"),
    ("/detokenize", '{"tokens": "abc"}', "'tokens' must be a list"),
])
def test_malformed_values_get_one_clear_400(server, path, raw, needle):
    status, r = call(server, path, raw)
    assert status == 400 and needle in r["error"]["message"] and r["error"]["code"] == 400, r


def test_a_surrogate_pair_is_a_character(server):
    status, r = call(server, "/tokenize", '{"prompt": "\\ud83d\\ude00"}')
    assert status == 200 and r["tokens"] == server.text.encode("\U0001F600")


def test_non_finite_logprobs_fail_the_request_not_the_json(ckpt):
    """A checkpoint whose weights hold NaN: its logprobs are NaN, which JSON cannot carry; the request fails with
    a clear 500 (a stream with an error event), and every body sent is valid JSON."""
    s = build(str(ckpt("qwen3")), port=0, dtype="float32", act_quant=False, max_model_len=64, kv_cache_gib=0.01)
    with torch.no_grad():
        s.engine.model.norm.weight.fill_(float("nan"))
    s.start_background()
    try:
        body = {"prompt": [5, 6], "max_tokens": 2, "temperature": 0, "logprobs": 1}
        status, r = call(s, "/v1/completions", body)
        assert status == 500 and "non-finite number" in r["error"]["message"] and "token_logprobs" in r["error"]["message"]
        status, raw = call(s, "/v1/completions", {**body, "stream": True})
        events = [json.loads(e[len("data: "):]) for e in raw.split("\n\n") if e]  # each event parses as JSON
        assert "non-finite number" in events[-1]["error"]["message"]
        assert call(s, "/v1/completions", {**body, "logprobs": None})[0] == 200  # no number that JSON cannot carry
    finally:
        s.close()
