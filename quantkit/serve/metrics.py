"""``GET /metrics``: the engine's counters and gauges in the Prometheus text format (vLLM's names,
under the ``quantkit:`` prefix)."""

from __future__ import annotations

from ..engine.ep_exchange import traffic
from .scheduler import LLMEngine


def render(engine: LLMEngine, model_name: str) -> str:
    s, label = engine.stats, f'model_name="{model_name}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP quantkit:{name} {help_}")
        lines.append(f"# TYPE quantkit:{name} {kind}")
        lines.extend(f"quantkit:{name}{{{label}{extra}}} {value}" for extra, value in samples)

    metric("num_requests_running", "gauge", "Requests in the running batch.", [("", len(engine.running))])
    metric("num_requests_waiting", "gauge", "Requests waiting to be scheduled.", [("", len(engine.waiting))])
    metric("kv_cache_usage_perc", "gauge", "Share of KV cache blocks in use (1 = all).", [("", round(engine.kv_usage, 6))])
    metric("prompt_tokens_total", "counter", "Prompt tokens prefilled.", [("", s.prompt_tokens)])
    metric("generation_tokens_total", "counter", "Tokens generated.", [("", s.generation_tokens)])
    metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", [("", s.prefix_queries)])
    metric("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache (not computed again).", [("", s.prefix_hits)])
    metric("num_preemptions_total", "counter", "Requests preempted (recomputed later) for KV cache room.", [("", s.preemptions)])
    metric("engine_steps_total", "counter", "Batches run.", [("", s.steps)])
    metric("request_success_total", "counter", "Finished requests by finish reason.",
           [(f',finished_reason="{k}"', v) for k, v in sorted(s.finished.items())] or [(',finished_reason="stop"', 0)])
    n = sum(s.finished.values())
    metric("e2e_request_latency_seconds_sum", "counter", "Sum of request latencies, arrival to finish.", [("", round(s.e2e_sum, 6))])
    metric("e2e_request_latency_seconds_count", "counter", "Requests in that sum.", [("", n)])
    metric("time_to_first_token_seconds_sum", "counter", "Sum of times to the first generated token.", [("", round(s.ttft_sum, 6))])
    ep = traffic(engine.model)
    if ep is not None:  # sharded serving with --ep-exchange all-to-all: this rank's (rank 0's) bytes
        for phase in ("dispatch", "combine"):
            for way in ("sent", "received"):
                metric(f"ep_{phase}_bytes_{way}_total", "counter", f"Bytes rank 0 {way} in the MoE layers' all-to-all {phase}.",
                       [(',rank="0"', ep[f"{phase}_{way}"])])
        metric("ep_exchange_layer_calls_total", "counter", "MoE layer exchanges those bytes add up over.", [(',rank="0"', ep["layer_calls"])])
    return "\n".join(lines) + "\n"
