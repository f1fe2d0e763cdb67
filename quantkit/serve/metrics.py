"""``GET /metrics``: the engine's counters and gauges in the Prometheus text format (vLLM's names,
under the ``quantkit:`` prefix)."""

from __future__ import annotations

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
    return "\n".join(lines) + "\n"
