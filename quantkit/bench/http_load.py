"""Serving throughput and latency through HTTP, from a load generator in its own process.

    quantkit serve CKPT --port 8000 --max-num-seqs 256 &          # the server, in its own process
    quantkit bench http --url http://127.0.0.1:8000 --out /tmp/bh --concurrency 1,8,32,64,128,256 \\
        --prompt-len 512 --gen 128 [--engine-results /tmp/bs/results.jsonl]

For each concurrency C, after an untimed round of C requests for 4 tokens, C clients (asyncio, one
connection per request) send ``--rounds`` requests each of ``--prompt-len`` random token ids for ``--gen``
greedy tokens (end of sequence ignored), once streamed and once whole.  Reported per C and mode: output tokens/s (all completion tokens over the
wall time), and for streams the time to first token and the inter-token latency (a request's mean
time per token after its first), p50 and p99 over requests; for whole responses the request latency.  With
``--engine-results`` (``quantkit bench serve``'s results.jsonl at the same prompt and generation
lengths) each row also gets the engine's tokens/s at that C and the HTTP / engine ratio.

Prints a table and writes results.jsonl (:mod:`.record`) and http.png (tokens/s against C, matplotlib) under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from urllib.parse import urlparse

from . import prog
from .record import flat, read


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default=None, help="served model name (default: the server's only one)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="requests per client at each concurrency")
    p.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn from [100, 100 + vocab)")
    p.add_argument("--engine-results", type=Path, default=None)
    p.add_argument("--no-lookahead", dest="lookahead", action="store_false",
                   help="the server runs --no-lookahead: compare with the engine's sync rows (default: its lookahead rows)")
    a = p.parse_args(argv)
    a.concurrency = [int(c) for c in a.concurrency.split(",")]
    u = urlparse(a.url)
    a.host, a.port = u.hostname, u.port or 80
    return a


async def send(a, path: str, body: dict | None = None):
    """Yields (arrival time, bytes) of a response's body pieces; the first item is the status line."""
    reader, writer = await asyncio.open_connection(a.host, a.port)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        method = "POST" if body is not None else "GET"
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     "Connection: close\r\n\r\n".encode() + data)
        head = await reader.readuntil(b"\r\n\r\n")
        yield time.perf_counter(), head
        while chunk := await reader.read(65536):
            yield time.perf_counter(), chunk
    finally:
        writer.close()


async def whole(a, body: dict) -> tuple[int, float]:
    start, raw = time.perf_counter(), b""
    async for _, piece in send(a, "/v1/completions", body):
        raw += piece
    assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
    text = raw.split(b"\r\n\r\n", 1)[1]
    return json.loads(text)["usage"]["completion_tokens"], time.perf_counter() - start


async def stream(a, body: dict) -> tuple[int, float, float]:
    """(tokens, time to first token, inter-token latency) of one streamed request: its mean time per token after the
    first (several events can arrive in one read, so the gap between two reads is not one token's)."""
    start, times, buf, tokens = time.perf_counter(), [], "", 0
    async for t, piece in send(a, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}):
        if piece.startswith(b"HTTP/1.1"):
            assert piece.startswith(b"HTTP/1.1 200"), piece[:300]
            continue
        buf += piece.decode("utf-8", "replace")
        while "\n\n" in buf:  # chunked framing lines are not events: only "data: " lines count
            event, buf = buf.split("\n\n", 1)
            for line in event.splitlines():
                if line.startswith("data: {"):
                    ev = json.loads(line[6:])
                    if ev.get("usage"):
                        tokens = ev["usage"]["completion_tokens"]
                    elif ev["choices"]:  # the server posts a request's delta when it has new tokens (or ends)
                        times.append(t)
    if not times:
        return tokens, float("nan"), float("nan")
    return tokens, times[0] - start, (times[-1] - times[0]) / max(1, tokens - 1)


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else (xs[0] if xs else float("nan"))


async def level(a, c: int, mode: str, rng: random.Random) -> dict:
    bodies = [{"prompt": [100 + rng.randrange(a.vocab) for _ in range(a.prompt_len)], "max_tokens": a.gen, "temperature": 0,
               "ignore_eos": True, **({"model": a.model} if a.model else {})} for _ in range(c * a.rounds)]
    results = []

    async def client(i: int) -> None:
        for r in range(a.rounds):
            body = bodies[i * a.rounds + r]
            results.append(await (stream(a, body) if mode == "stream" else whole(a, body)))

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(c)))
    wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    assert tokens == c * a.rounds * a.gen, (tokens, c * a.rounds * a.gen)
    row = {"concurrency": c, "mode": mode, "prompt_len": a.prompt_len, "gen": a.gen, "http_tok_s": tokens / wall}
    if mode == "stream":
        ttft, itl = [r[1] for r in results], [r[2] for r in results]
        row.update(ttft_p50_ms=1e3 * pct(ttft, 50), ttft_p99_ms=1e3 * pct(ttft, 99), itl_p50_ms=1e3 * pct(itl, 50),
                   itl_p99_ms=1e3 * pct(itl, 99))
    else:
        lat = [r[1] for r in results]
        row.update(latency_p50_ms=1e3 * pct(lat, 50), latency_p99_ms=1e3 * pct(lat, 99))
    return row


def engine_figures(path: Path | None, a) -> dict[int, float]:
    if path is None:
        return {}
    rows = [flat(r) for r in read(path)]
    # the engine in the server's mode: steps in sync, or launched ahead (`quantkit serve --lookahead`)
    return {r["concurrency"]: r["engine_tok_s"] for r in rows
            if r["prompt_len"] == a.prompt_len and r["gen"] == a.gen and bool(r.get("lookahead")) == a.lookahead}


def plot(rows: list[dict], engine: dict[int, float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in ("stream", "whole"):
        pts = [(r["concurrency"], r["http_tok_s"]) for r in rows if r["mode"] == mode]
        ax.plot(*zip(*pts), marker="o", label=f"HTTP, {mode}")
    if engine:
        ax.plot(*zip(*sorted(engine.items())), marker="s", linestyle="--", label="engine alone")
    ax.set(xscale="log", xlabel="concurrency", ylabel="output tokens/s", title="quantkit serve through HTTP")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str]) -> None:
    from .env import environment
    from .record import Run

    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    run = Run.start(__name__, argv, environment("cpu"))
    engine, rng, rows = engine_figures(a.engine_results, a), random.Random(0), []
    for mode in ("stream", "whole"):  # warm-up
        asyncio.run(level(a, 1, mode, random.Random(1)))
    for c in a.concurrency:
        # untimed: the same C for a few tokens first, as the serve benchmark does for the engine
        asyncio.run(level(argparse.Namespace(**{**vars(a), "gen": 4, "rounds": 1}), c, "whole", random.Random(c)))
        for mode in ("stream", "whole"):
            row = asyncio.run(level(a, c, mode, rng))
            if c in engine:
                row.update(engine_tok_s=engine[c], http_over_engine=row["http_tok_s"] / engine[c])
            rows.append(row)
            print(json.dumps(row), flush=True)
    for r in rows:
        run.write(a.out / "results.jsonl", {"url": a.url, **r}, ("url", "concurrency", "mode", "prompt_len", "gen"))
    print(f"\nprompt {a.prompt_len}, {a.gen} generated tokens per request, greedy; load generator in its own process")
    print("| C | mode | HTTP tok/s | engine tok/s | HTTP/engine | TTFT p50 / p99 ms | ITL p50 / p99 ms | latency p50 / p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for r in rows:
        print(f"| {r['concurrency']} | {r['mode']} | {r['http_tok_s']:.0f} | {r.get('engine_tok_s', nan):.0f} | "
              f"{r.get('http_over_engine', nan):.2f} | {r.get('ttft_p50_ms', nan):.1f} / {r.get('ttft_p99_ms', nan):.1f} | "
              f"{r.get('itl_p50_ms', nan):.1f} / {r.get('itl_p99_ms', nan):.1f} | "
              f"{r.get('latency_p50_ms', nan):.0f} / {r.get('latency_p99_ms', nan):.0f} |")
    try:
        plot(rows, engine, a.out / "http.png")
    except ImportError:
        print("no matplotlib: http.png not drawn (pip install -e '.[eval]')")

