"""What the serving host can deliver when the model is not the limit: ``quantkit serve``'s HTTP layer, engine
thread and scheduler over a stub forward, against ``quantkit bench http`` in its own process.

    quantkit bench http-ceiling --out /tmp/hc [--step-ms 5] [--concurrency 1,8,32,64,128,256] [--gen 128]

The stub: ``quantkit bench host-overhead``'s ``HostOnlyRunner`` (the graphed decode path's host side as it is, its
forward returning fixed ordinary tokens), each forward sleeping ``--step-ms`` (the GIL released, as a wait for
the GPU releases it); the rest -- scheduling, bookkeeping, detokenizing, deltas, SSE and JSON, asyncio -- is the
server's own.  Ideal = C x 1000 / step-ms tokens/s (each step one token per sequence);
``ideal share`` = HTTP tokens/s / ideal: below 1 by the host's time per step, the load generator's included
when it shares the cores (run it on a machine with cores to spare for a figure of the server alone).
Writes OUT/results.jsonl (the http benchmark's records) and prints a table last.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from . import prog
from .record import flat, read

BENCH = [sys.executable, "-m", "quantkit", "bench"]


def stub_server(ckpt: str, port: int, step_ms: float, max_num_seqs: int) -> None:
    from quantkit.serve.launch import build

    from .host_overhead import HostOnlyRunner  # the engine's own decode path, its forward stubbed

    class SleepingRunner(HostOnlyRunner):
        def _forward(self, b: int) -> dict:
            time.sleep(step_ms / 1e3)  # the GIL released, as a wait for the GPU releases it
            return super()._forward(b)

    server = build(ckpt, port=port, device="cpu", dtype="float32", max_num_seqs=max_num_seqs, max_num_batched_tokens=8192)
    eng = server.engine
    eng.runner = SleepingRunner(eng.model, eng.cache, max_num_seqs, eng.max_model_len, server.text.tok.get_vocab_size(with_added_tokens=False))
    eng.runner.capture()
    server.serve("warning")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ckpt", default=None, help="a checkpoint for the tokenizer and config (default: a tiny synthesized GPT-OSS)")
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--concurrency", default="1,8,32,64,128,256")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--port", type=int, default=8031)
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # internal: run the stub server on this checkpoint
    a = p.parse_args(argv)
    cs = [int(c) for c in a.concurrency.split(",")]
    if a.serve:
        return stub_server(a.serve, a.port, a.step_ms, max(cs))
    a.out.mkdir(parents=True, exist_ok=True)
    ckpt = a.ckpt
    if ckpt is None:
        from quantkit.synth import synthesize

        ckpt = str(a.out / "gpt-oss-tiny")
        if not Path(ckpt, "config.json").exists():
            synthesize("gpt-oss", ckpt, preset="tiny")
    server = subprocess.Popen([*BENCH, "http-ceiling", "--out", str(a.out), "--serve", ckpt, "--port", str(a.port),
                               "--step-ms", str(a.step_ms), "--concurrency", a.concurrency], stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{a.port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("the stub server did not come up in 120 s")
        subprocess.run([*BENCH, "http", "--url", url, "--out", str(a.out),
                        "--concurrency", a.concurrency, "--prompt-len", str(a.prompt_len), "--gen", str(a.gen), "--rounds", "1"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    rows = [flat(r) for r in read(a.out / "results.jsonl")]
    rows = [r for r in rows if r.get("url", "").endswith(f":{a.port}") and r["gen"] == a.gen][-2 * len(cs):]
    print(f"stub step {a.step_ms} ms, prompt {a.prompt_len}, {a.gen} tokens per request")
    print("| C | mode | HTTP tok/s | ideal tok/s | ideal share | ITL p50 ms |\n|---|---|---|---|---|---|")
    for r in rows:
        ideal = r["concurrency"] * 1e3 / a.step_ms
        itl = r.get("itl_p50_ms")
        print(f"| {r['concurrency']} | {r['mode']} | {r['http_tok_s']:.0f} | {ideal:.0f} | {r['http_tok_s'] / ideal:.2f} | "
              f"{'-' if itl is None else f'{itl:.1f}'} |")  # fmt: skip

