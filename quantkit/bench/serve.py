"""Serving throughput of the bundled engine: continuous batching offline and over HTTP.

    quantkit bench serve --out /tmp/bs --family gpt-oss --preset gpt-oss-20b --layers 8 --to fp8-block
    quantkit bench serve --out /tmp/bs --device cpu        # smoke run on the tiny preset

Synthesizes the checkpoint (full-size shapes, random weights, ``--layers`` cuts the depth), converts
it, loads it on the device, then for each concurrency C sends C requests of ``--prompt-len`` random
tokens for ``--gen`` greedy tokens (end of sequence ignored) and measures, in the same run:

* engine: :class:`LLMEngine` stepping the batch (prefill, then decode steps): output tokens/s, the
  median decode step, time to first token;
* raw: the model's forward on the same batch shape with the cache alone (no scheduler, no
  sampling, no detokenization): the baseline the engine's per-step overhead is measured against;
* roofline: the bytes a decode step must read from HBM (the dense weights, the experts the batch can
  touch -- E(1 - (1 - k/E)^C) of them per layer -- and the KV cache) over the peak bandwidth;
* http: the same requests from C client threads through ``quantkit serve``'s server.

Prints a table and writes bench.log and results.jsonl (one record per C, :mod:`.record`) under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from . import prog
from .env import environment
from .record import Run

PARAMS = ("model", "device", "concurrency", "prompt_len", "gen", "graphs", "lookahead")  # of a record; the rest are metrics


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog(__name__), description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--family", default="gpt-oss")
    p.add_argument("--preset", default=None, help="default: gpt-oss-20b on cuda, tiny on cpu")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--to", default="fp8-block", help="convert target, or 'source' to serve the checkpoint as synthesized")
    p.add_argument("--concurrency", default=None, help="comma list (default 1,8,32,64 on cuda, 1,4 on cpu)")
    p.add_argument("--prompt-len", type=int, default=None)
    p.add_argument("--gen", type=int, default=None)
    p.add_argument("--hbm-gbs", type=float, default=4800.0, help="peak HBM GB/s (H200: 4800)")
    p.add_argument("--no-http", action="store_true")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (the engine's eager decode step)")
    p.add_argument("--no-lookahead", dest="lookahead", action="store_false",
                   help="every graphed decode step waits for its tokens (default: launched one ahead, as quantkit serve runs)")
    p.add_argument("--prefill", default="", help="comma list of single-prompt prefill lengths to time (e.g. 8192,32768)")
    p.add_argument("--profile", action="store_true", help="write a torch profile of one decode step at the first concurrency")
    p.add_argument("--plot", action="store_true", help="write serve.png: output tokens/s and share of the HBM floor against C")
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    a.preset = a.preset or ("gpt-oss-20b" if cuda else "tiny")
    a.concurrency = [int(c) for c in (a.concurrency or ("1,8,32,64" if cuda else "1,4")).split(",")]
    a.prompt_len = a.prompt_len or (512 if cuda else 24)
    a.gen = a.gen or (128 if cuda else 6)
    return a


def prepare(a, log) -> Path:
    from quantkit.converters import ConvertOptions, convert
    from quantkit.synth import synthesize

    src = a.out / f"{a.family}-{a.preset}-{a.layers or 'all'}"
    if not (src / "config.json").exists():
        t = time.perf_counter()
        synthesize(a.family, src, preset=a.preset, layers=a.layers)
        log(f"synthesized {src.name} in {time.perf_counter() - t:.1f} s")
    if a.to == "source":
        return src
    dst = src.with_name(src.name + f"-{a.to}")
    if not (dst / "config.json").exists():
        t = time.perf_counter()
        convert(src, dst, ConvertOptions(to=a.to, device=a.device, workers=1))
        log(f"converted to {a.to} in {time.perf_counter() - t:.1f} s")
    return dst


def step_bytes(model, c: int, ctx: int) -> int:
    """HBM bytes one decode step of c sequences at context ctx must read: weights it uses, and the KV cache."""
    from quantkit.engine.layers.moe import MoE

    total = 0
    seen: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, MoE):
            e, k = mod.experts.num_experts, mod.router.routing.top_k
            tensors = list(mod.experts.buffers()) + list(mod.experts.parameters())
            used = e * (1 - (1 - k / e) ** c)
            total += int(used * sum(t.numel() * t.element_size() for t in tensors) / e)
            seen.update(id(t) for t in tensors)
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen or t is model.embed_tokens:
            continue
        total += t.numel() * t.element_size()
    total += model.embed_tokens.shape[1] * model.embed_tokens.element_size() * c  # the embedding rows read
    return total + c * ctx * model.kv_bytes_per_token()


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def new_engine(model, eos, c: int, a):
    """An engine whose cache holds c requests of prompt_len + gen tokens (16-token blocks), prompts prefilled whole;
    its decode graphs captured (as ``quantkit serve`` does at start-up) unless --enforce-eager."""
    from quantkit.serve.scheduler import LLMEngine

    blocks = c * (-(-(a.prompt_len + a.gen) // 16)) + 9  # + the graphs' scratch block
    eng = LLMEngine(model, blocks, 16, max_num_seqs=c, max_num_batched_tokens=max(8192, a.prompt_len), eos_ids=eos,
                    enforce_eager=getattr(a, "enforce_eager", False), lookahead=getattr(a, "lookahead", True))
    eng.runner.capture()
    return eng


def run_engine(model, eos, c: int, a, rng, warm_up: bool = False):
    from quantkit.serve.sampling import SamplingParams

    eng = new_engine(model, eos, c, a)
    if warm_up:  # as `quantkit serve` does at start: no timed step waits for a kernel to compile
        eng.warm_up()
    vocab = model.embed_tokens.shape[0]
    prompts = [[rng.randrange(vocab) for _ in range(a.prompt_len)] for _ in range(c)]
    params = SamplingParams(max_tokens=a.gen, temperature=0, ignore_eos=True)
    reqs = [eng.add_request(p, params) for p in prompts]
    sync(model.device)
    t0 = time.perf_counter()
    decode_steps = []
    while eng.has_work():
        s = time.perf_counter()
        prefilling = any(r.computed < len(r.prompt) for r in eng.running) or bool(eng.waiting)
        eng.step()
        if eng.ahead is None:  # with a step launched ahead, a call's time is the GPU's: syncing would undo the overlap
            sync(model.device)
        if not prefilling:
            decode_steps.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    ttft = statistics.median(r.first_token_time - r.arrival for r in reqs)
    assert all(len(r.output) == a.gen for r in reqs)
    return prompts, wall, statistics.median(decode_steps), ttft, eng


def graph_step(eng, c: int, reps: int = 30) -> float:
    """The captured decode graph of c sequences replayed alone (no scheduler, metadata, sampling or text), on the
    static buffers the engine's last decode step left: the forward a graphed engine step runs."""
    import torch

    g, _ = eng.runner.graphs[eng.runner.bucket(c)]
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        s = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - s)
    return statistics.median(times[3:])


def profile_step(eng, c: int, out: Path) -> None:
    """A torch profile of one graphed decode step replayed (kernels by total GPU time) -> profile.txt."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    g, _ = eng.runner.graphs[eng.runner.bucket(c)]
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
    (out / f"profile_c{c}.txt").write_text(f"5 replays of the decode graph of C = {c}\n{exclusive_times(prof, 5)}\n\n{table}\n")


def exclusive_times(prof, steps: int) -> str:
    """Per kernel name: launches and microseconds per step counted once on the GPU's timeline (a kernel launched
    as a programmatic dependent starts before its predecessor ends; the overlap is the predecessor's), and the
    idle gaps between kernels: where a step's time goes, summing to its wall time."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA") and e.time_range.end > e.time_range.start)
    if not spans:
        return "(no kernel events)"
    busy: dict[str, list[float]] = {}
    gap, end = 0.0, spans[0][0]
    for s, e, name in spans:
        gap += max(0.0, s - end)
        own = max(0.0, e - max(s, end))
        slot = busy.setdefault(name[:70], [0, 0.0])
        slot[0] += 1
        slot[1] += own
        end = max(end, e)
    total = end - spans[0][0]
    rows = sorted(busy.items(), key=lambda kv: -kv[1][1])
    lines = [f"timeline per step: {total / steps:.1f} us, of which idle between kernels {gap / steps:.1f} us",
             "| kernel | launches / step | us / step (own) | share |", "|---|---|---|---|"]
    lines += [f"| {n} | {k / steps:.1f} | {t / steps:.1f} | {100 * t / total:.1f}% |" for n, (k, t) in rows[:30]]
    return "\n".join(lines)


def prefill_time(model, n: int, reps: int = 3) -> float:
    """One prompt of n random tokens, cache-less, logits of its last token only: median seconds."""
    import torch

    ids = torch.randint(0, model.embed_tokens.shape[0], (n,), device=model.device)
    times = []
    with torch.no_grad():
        for _ in range(reps + 1):
            sync(model.device)
            s = time.perf_counter()
            model(ids, rows=[n - 1])
            sync(model.device)
            times.append(time.perf_counter() - s)
    return statistics.median(times[1:])


def raw_decode_step(model, c: int, ctx: int, reps: int = 20) -> float:
    """The eager forward alone on a decode batch of c sequences at context ctx (no scheduler, sampling or text)."""
    import torch

    cache = model.new_cache(c * (-(-(ctx + reps + 2) // 16)) + 4, 16)
    with torch.no_grad():
        b = cache.schedule({i: ctx for i in range(c)})
        ids = torch.randint(0, model.embed_tokens.shape[0], (c * ctx,), device=model.device)
        model.hidden(ids, b.positions, cache, b)
        times = []
        tok = torch.zeros(c, dtype=torch.int64, device=model.device)
        for _ in range(reps):
            b = cache.schedule({i: 1 for i in range(c)})
            sync(model.device)
            s = time.perf_counter()
            tok = model(tok, b.positions, cache, b, rows=b.last_token_rows()).argmax(-1)
            sync(model.device)
            times.append(time.perf_counter() - s)
    return statistics.median(times[2:])


def run_http(server, prompts, a) -> float:
    out = []

    def client(p) -> None:
        body = json.dumps({"prompt": p, "max_tokens": a.gen, "temperature": 0, "ignore_eos": True}).encode()
        with urllib.request.urlopen(urllib.request.Request(server.url + "/v1/completions", body), timeout=600) as r:
            out.append(json.loads(r.read())["usage"]["completion_tokens"])

    threads = [threading.Thread(target=client, args=(p,)) for p in prompts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert out == [a.gen] * len(prompts), out
    return wall


def main(argv: list[str]) -> None:
    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    logf = open(a.out / "bench.log", "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")

    import random

    import torch

    from quantkit.serve.server import Server
    from quantkit.serve.text import ModelText
    from quantkit.engine import load

    ckpt = prepare(a, log)
    run = Run.start(__name__, argv, environment(a.device))
    device = torch.device(a.device)
    t = time.perf_counter()
    model = load(ckpt, device, torch.bfloat16)
    sync(device)
    log(f"loaded {ckpt.name} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} in {time.perf_counter() - t:.1f} s; "
        f"torch {torch.__version__}; backends {sorted(set(model.ops.ran.values())) if hasattr(model.ops, 'ran') else '?'}")
    t = time.perf_counter()
    failed = model.prepare_kernels()  # as `quantkit serve` does at start: no step waits for nvcc
    log(f"DeepGEMM kernels ready in {time.perf_counter() - t:.1f} s" + (f"; failed: {failed}" if failed else ""))
    text = ModelText(ckpt, model.config)
    rng = random.Random(0)
    rows = []
    for n in [int(x) for x in a.prefill.split(",") if x]:
        t = prefill_time(model, n)
        log(json.dumps({"prefill_tokens": n, "seconds": round(t, 4), "tok_s": round(n / t)}))
    for c in a.concurrency:
        run_engine(model, text.eos_ids, c, argparse.Namespace(prompt_len=a.prompt_len, gen=4, enforce_eager=a.enforce_eager,
                                                              lookahead=a.lookahead), rng, warm_up=True)  # warm-up
        prompts, wall, step, ttft, eng = run_engine(model, text.eos_ids, c, a, rng)
        ctx = a.prompt_len + a.gen // 2
        graphed = eng.runner.graphed
        raw = graph_step(eng, c) if graphed else raw_decode_step(model, c, ctx)
        if a.profile and c in (a.concurrency[0], a.concurrency[-1]) and graphed:
            try:
                profile_step(eng, c, a.out)
            except Exception as e:  # a profile is a by-product: the figures go on without it
                log(f"profile of C = {c} failed: {type(e).__name__}: {e}")
        floor = step_bytes(model, c, ctx) / (a.hbm_gbs * 1e9)
        rep = eng.runner.report
        row = {"concurrency": c, "prompt_len": a.prompt_len, "gen": a.gen, "graphs": graphed, "lookahead": a.lookahead and graphed,
               "engine_tok_s": c * a.gen / wall,
               "decode_step_ms": step * 1e3, "raw_step_ms": raw * 1e3, "engine_over_raw": step / raw,
               "hbm_floor_ms": floor * 1e3, "hbm_share": floor / step, "ttft_ms": ttft * 1e3,
               "capture_s": rep.seconds if graphed else 0.0, "graph_mib": rep.bytes / 2**20 if graphed else 0.0}
        del eng
        if not a.no_http:
            eng = new_engine(model, text.eos_ids, c, a)
            server = Server(("127.0.0.1", 0), eng, text, ckpt.name)
            server.start_background()
            try:
                run_http(server, prompts[:1], argparse.Namespace(gen=4))
                row["http_tok_s"] = c * a.gen / run_http(server, prompts, a)
            finally:
                server.close()
                del eng, server
        rows.append(row)
        log(json.dumps(row))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for r in rows:
        run.write(a.out / "results.jsonl", {"model": ckpt.name, "device": a.device, **r}, PARAMS)
    mode = ("CUDA graphs" + (", lookahead" if rows[0]["lookahead"] else "")) if rows and rows[0]["graphs"] else "eager"
    log(f"\n{ckpt.name}, prompt {a.prompt_len}, {a.gen} generated tokens per request, greedy, bf16 activations, {mode}")
    log("| C | engine tok/s | http tok/s | decode step ms | raw forward ms | engine/raw | HBM floor ms | % of HBM | TTFT ms | capture s | graphs MiB |")
    log("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        log(f"| {r['concurrency']} | {r['engine_tok_s']:.0f} | {r.get('http_tok_s', float('nan')):.0f} | {r['decode_step_ms']:.2f} | "
            f"{r['raw_step_ms']:.2f} | {r['engine_over_raw']:.2f} | {r['hbm_floor_ms']:.3f} | {100 * r['hbm_share']:.0f} | {r['ttft_ms']:.0f} | "
            f"{r['capture_s']:.1f} | {r['graph_mib']:.0f} |")
    if a.plot and rows:
        plot(rows, a.out / "serve.png", f"{ckpt.name}, prompt {a.prompt_len}, {mode}")


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [r["concurrency"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(cs, [r["engine_tok_s"] for r in rows], "o-", label="output tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency C")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(cs, [100 * r["hbm_share"] for r in rows], "s--", color="tab:red", label="% of HBM floor")
    ax2.set_ylabel("decode step: % of the HBM floor")
    ax2.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    fig.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)

