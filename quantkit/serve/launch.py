"""Setting up ``quantkit serve``: load the checkpoint (whole, or this process's rank of a ``quantkit
shard`` output), size the KV cache, and bind the HTTP server (rank 0) or a follower (other ranks)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..engine.kv_cache import KVCache
from .dp import DPEngine
from .scheduler import LLMEngine
from .text import ModelText


GRAPH_RESERVE = 2 << 30  # device memory kept from the KV cache for the decode CUDA graphs (their use is reported at start-up)


def kv_blocks(model, block_size: int, memory_bytes: int, max_tokens: int) -> int:
    """KV cache blocks that fit ``memory_bytes``, at most what ``max_tokens`` cached tokens need."""
    fit = memory_bytes // (model.kv_bytes_per_token() * block_size)
    return int(max(1, min(fit, -(-max_tokens // block_size))))


def build(ckpt: str, *, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu", dtype: str = "bfloat16",
          model_name: str | None = None, max_model_len: int | None = None, max_num_seqs: int = 64,
          max_num_batched_tokens: int = 2048, block_size: int = 16, kv_cache_gib: float | None = None,
          gpu_memory_utilization: float = 0.9, act_quant: bool = True, backend: str = "auto",
          prefix_caching: bool = True, limits=None, dist_timeout_s: float = 300.0,
          ep_exchange: str = "all-reduce", enforce_eager: bool = False, lookahead: bool = True,
          api_servers: int = 1) -> Server | Worker:
    """Load the checkpoint and bind the server (not serving yet: ``serve()`` or ``start_background()``).

    KV cache: ``kv_cache_gib`` when given; otherwise on CUDA what ``gpu_memory_utilization`` of the
    device leaves after the weights, on a CPU 2 GiB; never more than ``max_num_seqs`` full contexts.
    ``limits`` (a :class:`.server.Limits`): what one client may ask of the HTTP server (its defaults when None);
    ``api_servers``: its HTTP front processes.
    A ``quantkit shard`` output is served expert (and tensor) parallel, one process per rank under torchrun
    (:mod:`.distributed`), each DP group with its own requests (:mod:`.dp`): rank 0 gets the Server, the
    other ranks a :class:`Worker`.  ``dist_timeout_s`` bounds every wait of one rank for the others;
    ``ep_exchange``: how the MoE layers exchange tokens (all-reduce, or all-to-all dispatch and combine).
    On a GPU the DeepGEMM kernels the GEMMs will run are compiled here (``CausalLM.prepare_kernels``: a first
    request of a new size would otherwise wait 4-5 s for nvcc), and on one GPU the decode steps' CUDA graphs
    captured (``enforce_eager``: none; ``lookahead``: :meth:`LLMEngine.step`) and every kind of step run once on
    dummy requests (``LLMEngine.warm_up``: Triton compiles each kernel specialisation at its first launch), before
    the server binds."""
    from ..engine import parallel
    from ..engine.loader import load
    from . import distributed

    root, man, ctrl, rank, tp, dp = Path(ckpt), distributed.sharded_root(ckpt), None, 0, 1, 1
    if man is not None:
        model, ctrl, rank, path = load_rank(root, man, device, dtype, act_quant, backend, dist_timeout_s, dp_groups=True,
                                            exchange=ep_exchange, max_num_seqs=max_num_seqs)
        tp = int(man["parallel"].get("tp", 1))
        dp = int(man["parallel"]["world_size"]) // tp
    else:
        path = root
        model = load(path, device, getattr(torch, dtype), act_quant=act_quant, backend=backend)
    limit = int(model.config.get("max_position_embeddings", 8192))
    max_len = min(max_model_len or min(limit, 8192), limit)
    if kv_cache_gib is not None:
        budget = int(kv_cache_gib * (1 << 30))
    elif model.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(model.device)
        budget = int(free - (1 - gpu_memory_utilization) * total) - GRAPH_RESERVE
    else:
        budget = 2 << 30
    if budget <= 0:
        raise ValueError(f"no memory left for the KV cache (gpu_memory_utilization {gpu_memory_utilization})")
    blocks = kv_blocks(model, block_size, budget, max_num_seqs * max_len)
    if ctrl is not None:
        blocks = parallel.agree_min(blocks, ctrl)
    if blocks * block_size < max_len:
        raise ValueError(f"the KV cache holds {blocks * block_size} tokens, less than max_model_len {max_len}: "
                         "give it more memory or lower --max-model-len")
    if rank > 0:
        return Worker(model, model.new_cache(blocks, block_size), ctrl, rank, tp)
    text = ModelText(path, model.config)

    def scheduler(cache: KVCache | None = None) -> LLMEngine:
        return LLMEngine(model, blocks, block_size, max_num_seqs, max_num_batched_tokens, max_len, text.eos_ids,
                         prefix_caching, cache, enforce_eager, lookahead)

    engine = scheduler()
    t = time.perf_counter()
    failed = model.prepare_kernels()  # on a GPU: DeepGEMM's kernels for every M auto sends it, built now, not at a request
    ops = getattr(model, "ops", None)
    auto = model.device.type == "cuda" and ops is not None and ops.want("gemm_fp8_block") == "auto"
    warmup = [f"DeepGEMM kernels ready in {time.perf_counter() - t:.1f} s"] if auto else []
    warmup += [f"a DeepGEMM kernel did not build (Triton runs instead): {e}" for e in failed]
    engine.runner.capture()
    if model.device.type == "cuda" and ctrl is None:  # one process: every step kind once, its kernels compiled now
        steps, secs = engine.warm_up()
        warmup.append(f"warm-up: {steps} steps in {secs:.1f} s")
    if ctrl is not None:  # the other groups' caches live on their ranks: rank 0 keeps their block tables
        engine = DPEngine([engine] + [scheduler(KVCache([], blocks, block_size)) for _ in range(dp - 1)], ctrl, tp,
                          idle_tick_s=dist_timeout_s / 4)
    from .server import Server  # the HTTP side (fastapi, uvicorn): rank 0 alone

    server = Server((host, port), engine, text, model_name or root.resolve().name, limits, api_servers)
    server.ctrl = ctrl
    server.warmup = warmup
    return server


def load_rank(root: Path, man: dict, device: str, dtype: str, act_quant: bool = True, backend: str = "auto",
              dist_timeout_s: float = 300.0, dp_groups: bool = False, exchange: str = "all-reduce", max_num_seqs: int = 64):
    """This process's rank of a ``quantkit shard`` output (torchrun's environment says which), joined to
    its process groups with its expert- and tensor-parallel layers attached: (model, gloo control group,
    rank, rank directory).  ``dp_groups``: each DP group runs its own tokens (serving), the MoE layers
    exchange them (:class:`..engine.parallel.DPExchange`); otherwise every rank runs the same batch."""
    from ..engine import parallel
    from ..engine.loader import load
    from . import distributed

    rank, world, path = distributed.launch_info(root, man)
    dev, ctrl = parallel.init(device, dist_timeout_s)
    tp = int(man["parallel"].get("tp", 1))
    tp_group = parallel.tp_groups(world, tp) if tp > 1 else None
    model = load(path, dev, getattr(torch, dtype), act_quant=act_quant, backend=backend, rank_of_shard=True)
    parallel.attach(model, world // tp if dp_groups else 1, tp, tp_group, exchange, max_num_seqs)
    if tp_group is not None:
        parallel.attach_tp(model, tp_group)
    return model, ctrl, rank, path


class Worker:
    """A rank > 0 of sharded serving: replays rank 0's steps until rank 0 stops."""

    def __init__(self, model, cache, ctrl, rank: int, tp: int) -> None:
        self.model, self.cache, self.ctrl, self.rank, self.tp = model, cache, ctrl, rank, tp

    def serve(self) -> int:
        from .distributed import worker_loop

        return worker_loop(self.model, self.cache, self.ctrl, self.rank, self.tp)

    def server_close(self) -> None:
        pass
