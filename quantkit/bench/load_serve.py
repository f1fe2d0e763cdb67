"""Load and abuse against ``quantkit serve``: the server in one process, this load generator in another.

    quantkit bench load-serve                                  # 512 clients, 300 slowloris, tiny Qwen3 on the CPU
    quantkit bench load-serve --clients 32 --slowloris 20      # the CI size (tests/serve/test_load.py)
    quantkit bench load-serve --ckpt CKPT --device cuda --dtype bfloat16 --max-tokens 64

Loopback only, bounded (``--deadline`` seconds in all), stopping by itself (SIGINT to the server, which
must exit 0).  Phases:

1. reference: each prompt alone, greedy; the texts every later greedy answer must equal;
2. load: ``--clients`` clients connect at once, each sending ``--requests`` requests mixing a whole
   response, a stream (with usage), ``n = 2`` sampled choices and a stream it drops after the first
   event.  Every request must be answered correctly (greedy texts equal the reference, streams add
   up, usage counts right) or refused with 429 / 503; a connection reset or any other answer is a
   failure.  Beside them ``--late-clients`` clients connect and send their request only after the
   server's header deadline (as a request retransmitted after a full accept queue arrives late): each
   must read a 408 (a 503 if its connection was past the server's cap), not find it closed or reset;
3. latency: ``--probe-clients`` clients send whole greedy requests back to back, once alone and once
   beside ``--slowloris`` connections trickling header bytes (reconnecting when cut); the p99 latency
   of the second run must be within ``--max-slowdown`` (2) times the first's (``--no-latency-check``
   reports it without judging: a shared CI machine's timing is not the server's);
4. the end: ``/metrics`` shows no request running or waiting and the KV cache empty.

Prints one JSON summary on stdout, with ``connections_broken``: the connections of every phase refused,
reset or closed without an answer, by kind (none is the goal); exit status 0 only if every check held.  With
``--out``, the summary is also one record in OUT/results.jsonl (:mod:`.record`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import prog

PROMPTS = [[5 + i, 17, 301 + 7 * i, 44, 9] for i in range(8)]
HEADER_TIMEOUT = 2  # the server's --header-timeout here: the slow connections are cut within the run


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", type=Path, default=None, help="checkpoint to serve (default: a tiny synthesized Qwen3)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--clients", type=int, default=512)
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--late-clients", type=int, default=16, help="clients sending their request after the header deadline")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--slowloris", type=int, default=300)
    p.add_argument("--probe-clients", type=int, default=8)
    p.add_argument("--probe-requests", type=int, default=12)
    p.add_argument("--max-slowdown", type=float, default=2.0)
    p.add_argument("--no-latency-check", action="store_true")
    p.add_argument("--deadline", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--server-log", type=Path, default=None, help="write the server's stderr here (default: discarded)")
    p.add_argument("--out", type=Path, default=None, help="directory for results.jsonl")
    return p.parse_args(argv)


def start_server(a, ckpt: Path) -> tuple[subprocess.Popen, str, int]:
    cmd = [sys.executable, "-m", "quantkit", "serve", str(ckpt), "--port", "0", "--device", a.device, "--dtype", a.dtype,
           "--max-model-len", "256", "--kv-cache-gib", "0.05", "--served-model-name", "load",
           "--header-timeout", str(HEADER_TIMEOUT)] + (["--no-act-quant"] if a.dtype == "float32" else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(r"serving load on http://([\d.]+):(\d+) ", line)
    if not m:
        proc.kill()
        raise SystemExit(f"the server did not start: {line}{proc.stderr.read()}")
    log = open(a.server_log, "w") if a.server_log else None  # noqa: SIM115 (written by the drain thread until the server exits)

    def drain() -> None:  # a full pipe would stall the server
        for ln in proc.stderr:
            if log is not None:
                log.write(ln)
                log.flush()

    threading.Thread(target=drain, daemon=True).start()
    return proc, m.group(1), int(m.group(2))


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + rest[:n], rest[n + 2:]
    return out


async def request(host: str, port: int, method: str, path: str, body: dict | None = None, drop: bool = False,
                  delay: float = 0.0):
    """(status, headers text, body bytes) of one request on its own connection, sent ``delay`` s after connecting;
    ``drop``: close after the first event."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        await asyncio.sleep(delay)
        data = json.dumps(body).encode() if body is not None else b""
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: load\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     "Connection: close\r\n\r\n".encode() + data)
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        if drop and head.split()[1] == "200":  # a refusal (503) is read whole: it has no event to drop after
            await reader.readuntil(b"data: ")
            return 200, head, b""
        raw = await reader.read()
        return int(head.split()[1]), head, dechunk(raw) if "transfer-encoding: chunked" in head else raw
    finally:
        writer.close()


def events(raw: bytes) -> list:
    parts = [p[len("data: "):] for p in raw.decode().split("\n\n") if p]
    assert parts and parts[-1] == "[DONE]", parts[-1:]
    return [json.loads(p) for p in parts[:-1]]


BROKEN = (ConnectionError, asyncio.IncompleteReadError)  # a connection refused, reset or closed without an answer


def broken_kind(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    if isinstance(e, asyncio.IncompleteReadError):
        return "closed without an answer" if not e.partial else "cut mid-answer"
    return "reset" if isinstance(e, (ConnectionResetError, BrokenPipeError)) else type(e).__name__


class Tally:
    def __init__(self) -> None:
        self.ok, self.refused, self.late, self.failures = 0, 0, 0, []  # late: late requests answered 408 (or 503)
        self.broken: collections.Counter[str] = collections.Counter()  # broken_kind -> connections

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def lost(self, what: str, e: BaseException) -> None:
        self.broken[broken_kind(e)] += 1
        self.fail(f"{what}: {type(e).__name__}: {e}")


async def one(a, host, port, kind: str, prompt: int, ref: dict, t: Tally) -> None:
    base = {"model": "load", "prompt": PROMPTS[prompt], "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}
    body = {**base, "stream": True, "stream_options": {"include_usage": True}} if kind in ("stream", "drop") else base
    if kind == "n":
        body = {**base, "n": 2, "temperature": 0.8, "seed": prompt}
    try:
        status, _, raw = await request(host, port, "POST", "/v1/completions", body, drop=kind == "drop")
    except BROKEN as e:
        return t.lost(kind, e)
    if status in (429, 503):
        t.refused += 1
        return
    if status != 200:
        return t.fail(f"{kind}: status {status}: {raw[:200]!r}")
    try:
        if kind == "whole":
            assert json.loads(raw)["choices"][0]["text"] == ref[prompt], "greedy text differs from the reference"
        elif kind == "stream":
            ev = events(raw)
            assert "".join(e["choices"][0]["text"] for e in ev[:-1]) == ref[prompt], "streamed text differs"
            assert ev[-1]["usage"]["completion_tokens"] == a.max_tokens, ev[-1]
        elif kind == "n":
            r = json.loads(raw)
            assert [c["finish_reason"] for c in r["choices"]] == ["length", "length"], r
            assert r["usage"]["completion_tokens"] == 2 * a.max_tokens, r["usage"]
    except (AssertionError, KeyError, ValueError) as e:
        return t.fail(f"{kind}: {e}")
    t.ok += 1


async def late(a, host, port, t: Tally) -> None:
    """A request sent after the header deadline: its answer must be a 408 (or the 503 of a connection past the
    server's cap, answered on connecting)."""
    body = {"model": "load", "prompt": PROMPTS[0], "max_tokens": a.max_tokens}
    try:
        status, _, raw = await request(host, port, "POST", "/v1/completions", body, delay=HEADER_TIMEOUT + 0.5)
    except BROKEN as e:
        return t.lost("late", e)
    if status not in (408, 503):
        return t.fail(f"late: status {status}: {raw[:200]!r}")
    t.late += 1


async def load(a, host, port, ref) -> Tally:
    t, rng = Tally(), random.Random(0)
    kinds = ["whole", "stream", "n", "drop"]

    async def client(c: int) -> None:
        for _ in range(a.requests):
            await one(a, host, port, kinds[c % 4] if _ == 0 else rng.choice(kinds), rng.randrange(len(PROMPTS)), ref, t)

    await asyncio.gather(*(client(c) for c in range(a.clients)), *(late(a, host, port, t) for _ in range(a.late_clients)))
    return t


async def probe(a, host, port, ref) -> tuple[list[float], Tally]:
    t, lat = Tally(), []

    async def client(c: int) -> None:
        for i in range(a.probe_requests):
            start = time.perf_counter()
            await one(a, host, port, "whole", (c + i) % len(PROMPTS), ref, t)
            lat.append(time.perf_counter() - start)

    await asyncio.gather(*(client(c) for c in range(a.probe_clients)))
    return lat, t


def slowloris(host: str, port: int, n: int, stop, cuts) -> None:
    """A process of its own (its writes must not slow the probes' event loop): n connections sending a header
    byte every 0.2 s, each reconnecting when the server cuts it, until ``stop``; ``cuts`` counts the cuts."""
    asyncio.run(_slowloris(host, port, n, stop, cuts))


async def _slowloris(host: str, port: int, n: int, stop, cuts) -> None:

    async def one_conn() -> None:
        while not stop.is_set():
            try:
                _, writer = await asyncio.open_connection(host, port)
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: slow\r\n")
                while not stop.is_set():
                    writer.write(b"X")
                    await writer.drain()
                    await asyncio.sleep(0.2)
                writer.close()
            except ConnectionError:
                with cuts.get_lock():
                    cuts.value += 1
                await asyncio.sleep(0.05)

    await asyncio.gather(*(one_conn() for _ in range(n)), return_exceptions=True)


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) > 1 else xs[0]


async def metrics_idle(host: str, port: int, timeout: float, t: Tally) -> dict:
    """The gauges once nothing runs or waits (or when ``timeout`` passes; empty if no read succeeded)."""
    end, g = time.monotonic() + timeout, {}
    while True:
        try:
            _, _, raw = await request(host, port, "GET", "/metrics")
            g = {m: float(v) for m, v in re.findall(r"^quantkit:(\w+)\{[^}]*\} (\S+)$", raw.decode(), re.M)}
        except BROKEN as e:
            t.lost("metrics", e)
        idle = g and g["num_requests_running"] == g["num_requests_waiting"] == g["kv_cache_usage_perc"] == 0
        if idle or time.monotonic() > end:
            return g
        await asyncio.sleep(0.1)


async def reference(a, host: str, port: int, t: Tally) -> dict[int, str | None]:
    """Each prompt's greedy text, alone (None where the connection broke: every later answer to it then fails)."""
    ref = {}
    for i, p in enumerate(PROMPTS):
        try:
            _, _, raw = await request(host, port, "POST", "/v1/completions",
                                      {"prompt": p, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True})
            ref[i] = json.loads(raw)["choices"][0]["text"]
        except BROKEN as e:
            t.lost("reference", e)
            ref[i] = None
    return ref


async def run(a, host: str, port: int) -> dict:
    t0 = Tally()  # the reference and /metrics requests
    ref = await reference(a, host, port, t0)
    start = time.perf_counter()
    t = await load(a, host, port, ref)
    out = {"clients": a.clients, "requests": a.clients * a.requests, "answered": t.ok, "refused": t.refused,
           "late_clients": a.late_clients, "late_answered": t.late,  # with a 408 (or 503)
           "failures": t.failures[:20], "failed": len(t.failures), "load_s": round(time.perf_counter() - start, 2)}
    alone, t1 = await probe(a, host, port, ref)
    stop, cuts = multiprocessing.Event(), multiprocessing.Value("i", 0)
    loris = multiprocessing.Process(target=slowloris, args=(host, port, a.slowloris, stop, cuts), daemon=True)
    loris.start()
    up = time.monotonic()
    await asyncio.sleep(1.0)  # the slow connections are up
    beside, t2 = await probe(a, host, port, ref)
    await asyncio.sleep(max(0.0, up + 3 * HEADER_TIMEOUT - time.monotonic()))  # long enough to be cut, and come back
    stop.set()
    loris.join(timeout=30)
    out.update(p99_alone_s=round(p99(alone), 4), p99_slowloris_s=round(p99(beside), 4), slowloris_cuts=cuts.value,
               probe_failed=len(t1.failures) + len(t2.failures), probe_failures=(t1.failures + t2.failures)[:10])
    out["slowdown"] = round(out["p99_slowloris_s"] / out["p99_alone_s"], 2)
    out["end_metrics"] = await metrics_idle(host, port, 30, t0)
    out["connections_broken"] = dict(t0.broken + t.broken + t1.broken + t2.broken)
    out["other_failures"] = t0.failures[:10]
    return out


def main(argv: list[str]) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a = parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = a.ckpt
        if ckpt is None:
            from quantkit.synth import synthesize

            ckpt = Path(tmp) / "qwen3-tiny"
            synthesize("qwen3", ckpt, preset="tiny")
        proc, host, port = start_server(a, ckpt)
        try:
            out = asyncio.run(asyncio.wait_for(run(a, host, port), a.deadline))
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                out_rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out_rc = "killed"
    m = out["end_metrics"]
    checks = {"every request answered or refused": out["failed"] == 0 and out["answered"] + out["refused"] == out["requests"],
              "every late request answered 408 (or 503)": out["late_answered"] == out["late_clients"],
              "probes answered": out["probe_failed"] == 0,
              "no connection refused, reset or closed without an answer": not out["connections_broken"],
              "nothing running, waiting or cached at the end": bool(m) and m["num_requests_running"] == m["num_requests_waiting"] == 0
              and m["kv_cache_usage_perc"] == 0,
              "the server exits 0": out_rc == 0}
    if not a.no_latency_check:
        checks[f"p99 beside slowloris within {a.max_slowdown}x"] = out["slowdown"] <= a.max_slowdown
    out["checks"] = checks
    print(json.dumps(out, indent=1))
    if a.out:
        from .env import environment
        from .record import Run

        a.out.mkdir(parents=True, exist_ok=True)
        Run.start(__name__, argv, environment("cpu")).write(a.out / "results.jsonl", {"device": a.device, "dtype": a.dtype, **out}, ("device", "dtype", "clients"))
    return 0 if all(checks.values()) else 1
