"""Benchmarks, sweeps and profiles, run as ``quantkit bench NAME [OPTIONS]``.

Each benchmark is one module of this package with its own options (``quantkit bench NAME --help``) and a
``main(argv)``; :data:`BENCHMARKS` names them.  What they share: :mod:`.env` (the one environment record),
:mod:`.timer` (eager, CUDA-graph with L2 flush, CUDA events, and wall clock for ``--device cpu``),
:mod:`.record` (the one JSON-lines result record) and, for the kernel benchmarks, :mod:`.harness`
(rows, checks, the report helpers).  Nothing here is imported by ``quantkit`` itself: the command line
imports a benchmark's module only when it runs.
"""

from __future__ import annotations

# command name -> module of this package (the one registry of benchmarks)
BENCHMARKS: dict[str, str] = {
    "kernels": "kernels",  # GEMM family and its config sweep
    "moe": "moe",
    "attention": "attention",
    "mla": "mla",
    "formats": "formats",
    "fused-quant": "fused_quant",
    "sweep-decode": "sweep_decode",
    "sweep-moe-decode": "sweep_moe_decode",
    "sweep-moe-prefill": "sweep_moe_prefill",
    "profile-moe": "profile_moe",
    "convert": "convert",
    "shard": "shard",
    "hash": "source_hash",
    "serve": "serve",
    "http": "http_load",
    "http-ceiling": "http_ceiling",
    "host-overhead": "host_overhead",
    "load-serve": "load_serve",
    "ep-traffic": "ep_traffic",
    "sharded-gap": "sharded_gap",
    "roofline": "roofline",
}


def command_name(module: str) -> str:
    """The command name of a benchmark module (``quantkit.bench.fused_quant`` -> ``fused-quant``)."""
    short = module.rsplit(".", 1)[-1]
    return next(name for name, mod in BENCHMARKS.items() if mod == short)


def prog(module: str) -> str:
    """How a benchmark is invoked, for its parser's usage line: ``quantkit bench NAME``."""
    return f"quantkit bench {command_name(module)}"
