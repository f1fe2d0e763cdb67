"""``quantkit serve CKPT``: an OpenAI-compatible HTTP server on the bundled engine."""

from __future__ import annotations

import click


@click.command()
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one, printed at start).")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True,
              help="Activation and KV cache dtype.")
@click.option("--served-model-name", default=None, help="Model id of the API (default: CKPT's folder name).")
@click.option("--max-model-len", type=click.IntRange(min=2), default=None,
              help="Longest prompt + completion in tokens (default: the model's, at most 8192).")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=64, show_default=True, help="Most requests in one batch.")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Most tokens in one batch (longer prompts are prefilled in chunks).")
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True, help="Tokens per KV cache block.")
@click.option("--kv-cache-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="KV cache size (default: --gpu-memory-utilization of the GPU after the weights; 2 GiB on a CPU).")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="Share of the GPU's memory the weights and KV cache may use.")
@click.option("--act-quant/--no-act-quant", default=True, show_default=True,
              help="Quantize activations dynamically as the checkpoint's format asks (off: unquantized activations).")
@click.option("--backend", type=click.Choice(["auto", "torch"]), default="auto", show_default=True,
              help="Kernel backend: auto (fastest available) or torch (the reference ops).")
@click.option("--api-key", envvar="QUANTKIT_API_KEY", default=None,
              help="Ask /v1/* requests for 'Authorization: Bearer KEY' (also from $QUANTKIT_API_KEY).")
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", "prefix_caching", default=True, show_default=True,
              help="Reuse the KV blocks of prompt prefixes already computed (not in sharded serving).")
@click.option("--max-request-bytes", type=click.IntRange(min=1), default=16 << 20, show_default=True,
              help="Largest request body (a larger declared one is refused before it is read).")
@click.option("--max-seqs-per-request", type=click.IntRange(min=1), default=256, show_default=True,
              help="Most sequences (prompts x n) in one request.")
@click.option("--max-tokens-per-request", type=click.IntRange(min=1), default=1 << 18, show_default=True,
              help="Most tokens (prompt + max_tokens, over its sequences) one request may ask for.")
@click.option("--max-waiting-seqs", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Sequences waiting for admission past which new requests get a 503 with Retry-After.")
@click.option("--max-connections", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Open connections past which a new one gets a 503 with Retry-After at once.")
@click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds a connection has to send a whole request head.")
@click.option("--body-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds a request has to send its whole body.")
@click.option("--dist-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Sharded serving: seconds one rank waits for the others (a longer step, or a dead rank, is an error).")
@click.option("--ep-exchange", type=click.Choice(["all-reduce", "all-to-all"]), default="all-reduce", show_default=True,
              help="Sharded serving: how MoE layers exchange tokens (all-to-all: each token only to the ranks of its experts).")
@click.option("--enforce-eager", is_flag=True, default=False,
              help="No CUDA graphs: every decode step runs eagerly (graphs are captured at start-up on a GPU otherwise).")
@click.option("--lookahead/--no-lookahead", default=True, show_default=True,
              help="Launch graphed decode steps of plain-greedy requests one ahead of the host, which schedules the next "
                   "step while the GPU runs this one (--no-lookahead: every step waits for its tokens).")
@click.option("--api-server-count", "api_servers", type=click.IntRange(min=1), default=1, show_default=True,
              help="HTTP front processes (parsing, tokenizing, detokenizing, streaming), all accepting on the one port; "
                   "--max-connections is shared among them.")
def serve(ckpt: str, host: str, port: int, device: str, dtype: str, served_model_name: str | None, max_model_len: int | None,
          max_num_seqs: int, max_num_batched_tokens: int, block_size: int, kv_cache_gib: float | None, gpu_memory_utilization: float,
          act_quant: bool, backend: str, api_key: str | None, prefix_caching: bool, max_request_bytes: int,
          max_seqs_per_request: int, max_tokens_per_request: int, max_waiting_seqs: int, max_connections: int,
          header_timeout: float, body_timeout: float, dist_timeout: float, ep_exchange: str, enforce_eager: bool,
          lookahead: bool, api_servers: int) -> None:
    """Serve checkpoint CKPT (a source checkpoint or a `quantkit convert` output) over HTTP.

    A `quantkit shard --ep N [--tp T]` output is served expert (and tensor) parallel, one process per
    rank: `torchrun --nproc-per-node N -m quantkit serve CKPT` (rank 0 listens); each of its N / T
    data-parallel groups runs its own requests.

    Endpoints: POST /v1/completions and /v1/chat/completions (streaming with "stream": true),
    GET /v1/models, /health, /metrics.  The limits above hold for every client, before a body is read.  Requests share the GPU through continuous batching over a
    paged KV cache; prompts longer than --max-num-batched-tokens are prefilled in chunks."""
    import os

    from ..checkpoint import CheckpointError
    from ..serve.launch import build
    from ..serve.server.limits import Limits
    from .eval import _device

    if os.environ.get("RANK", "0") == "0":  # torchrun's rank: 0 (or a single process) serves HTTP
        _need_http_extra()
    limits = Limits(max_body_bytes=max_request_bytes, header_timeout_s=header_timeout, body_timeout_s=body_timeout,
                    max_seqs_per_request=max_seqs_per_request, max_tokens_per_request=max_tokens_per_request,
                    max_waiting_seqs=max_waiting_seqs, max_connections=max_connections)
    try:
        server = build(ckpt, host=host, port=port, device=_device(device), dtype=dtype, model_name=served_model_name,
                       max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       block_size=block_size, kv_cache_gib=kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization,
                       act_quant=act_quant, backend=backend, prefix_caching=prefix_caching, limits=limits,
                       dist_timeout_s=dist_timeout, ep_exchange=ep_exchange, enforce_eager=enforce_eager,
                       lookahead=lookahead, api_servers=api_servers)
    except (CheckpointError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    import signal

    from ..serve.launch import Worker
    from ..serve.request import EngineBroken

    def interrupt(signum, frame):  # SIGTERM (torchrun, service managers) stops as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    if isinstance(server, Worker):  # sharded serving: ranks > 0 replay rank 0's steps
        # Ctrl-C reaches every process of the terminal: rank 0 stops the server and sends the stop message, so the
        # other ranks leave after it and exit 0 (interrupted mid-collective they would exit 1, a failure to torchrun)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        click.echo(f"rank {server.rank}: holding its share of the model, following rank 0", err=True)
        try:
            steps = server.serve()
        except EngineBroken as e:
            _leave_group()
            raise click.ClickException(str(e)) from None
        held = server.cache.num_blocks - len(server.cache.free_blocks)
        click.echo(f"rank {server.rank}: stopped after {steps} steps with its group's tokens, {held} KV blocks held", err=True)
        _exit_sharded()
        return
    server.api_key = api_key
    eng = server.engine
    runner = getattr(eng, "runner", None)  # a sharded front end (DPEngine) runs eagerly
    graphs = str(runner.report) if runner is not None and runner.report is not None else \
        f"eager decode ({runner.why_eager if runner is not None else 'sharded serving'})"
    for line in getattr(server, "warmup", []):
        click.echo(line, err=True)
    click.echo(f"serving {server.model_name} on {server.url} (device {eng.model.device}, max_model_len {eng.max_model_len}, "
               f"KV cache {eng.cache.num_blocks} blocks of {eng.cache.block_size} tokens; {graphs})", err=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    except EngineBroken as e:
        server.server_close()
        _leave_group()
        raise click.ClickException(str(e)) from None
    server.server_close()
    if server.ctrl is not None:
        _exit_sharded()


def _need_http_extra() -> None:
    """fastapi, uvicorn and pydantic come with the serve extra (rank 0 alone needs them).  They are imported here,
    before a model loads or a socket listens: a package that is present but cannot import (a dependency of its own
    missing, as fastapi >= 0.165 without opentelemetry-api) fails the command with its reason, not the first client."""
    import importlib

    for m in ("fastapi", "uvicorn", "pydantic"):
        try:
            importlib.import_module(m)
        except ImportError as e:
            why = "is not installed" if isinstance(e, ModuleNotFoundError) and e.name == m else f"does not import ({e})"
            raise click.ClickException(f"`quantkit serve` needs {m}, which {why}: pip install 'quantkit[serve]' "
                                       "(from a checkout: pip install -e '.[serve]')") from None


def _exit_sharded() -> None:
    """A sharded rank that stopped cleanly (the stop message sent or received) exits 0 at once: tearing down
    gloo's and NCCL's groups, or letting the interpreter finalize them, could abort the process (SIGABRT seen
    from rank 0 after SIGTERM, once in many runs), and nothing is left to release but the process itself."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _leave_group() -> None:
    """Tear down torch.distributed's groups (sharded serving) before the interpreter exits: their threads
    would otherwise abort the process at exit."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
