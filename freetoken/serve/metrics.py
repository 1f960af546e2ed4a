"""/metrics in the Prometheus text format (prometheus_client), one registry per server: request and token
counters, time to first token and inter-token latency, running / waiting requests, the decode batch size, and the
engine's expert-cache and prefix-cache counters read at scrape time."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Live:
    """Values owned by the service and the engine, read when scraped."""

    def __init__(self, counters, stats: Callable[[], dict]):
        self.counters, self.stats = counters, stats

    def collect(self):
        c = self.counters
        yield GaugeMetricFamily("freetoken_requests_running", "requests generating now", value=c.running)
        yield GaugeMetricFamily("freetoken_requests_waiting", "requests queued for a slot", value=c.waiting)
        yield CounterMetricFamily("freetoken_requests_rejected", "requests refused because the queue was full",
                                  value=c.rejected)
        yield CounterMetricFamily("freetoken_requests_cancelled", "requests whose client left before the end",
                                  value=c.cancelled)
        stats = self.stats()
        experts = stats.get("expert_cache") or {}
        for key, name, doc in (("hits", "hits", "expert accesses served from a device slot"),
                               ("misses", "misses", "expert accesses fetched or run on the CPU"),
                               ("fetched_bytes", "fetched_bytes", "expert bytes copied into device slots")):
            if key in experts:
                yield CounterMetricFamily(f"freetoken_expert_cache_{name}", doc, value=experts[key])
        prefix = stats.get("prefix_cache") or {}
        for key, doc in (("lookups", "prefix-cache lookups"),
                         ("hit_lookups", "prefix-cache lookups that reused at least one token"),
                         ("anchor_hits", "prefix-cache lookups that reused up to at least one message boundary"),
                         ("snapshot_hits", "prefix-cache lookups that resumed from a recurrent-state snapshot"),
                         ("reused_tokens", "prompt tokens served from the prefix cache"),
                         ("computed_tokens", "prompt tokens prefilled")):
            if key in prefix:
                yield CounterMetricFamily(f"freetoken_prefix_cache_{key}", doc, value=prefix[key])


class Metrics:
    def __init__(self, counters, stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("freetoken_requests", "finished requests by finish reason", ["finish"], registry=r)
        self.prompt_tokens = Counter("freetoken_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("freetoken_generation_tokens", "generated tokens", registry=r)
        self.ttft = Histogram("freetoken_time_to_first_token_seconds", "request arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("freetoken_inter_token_latency_seconds", "time between a request's tokens",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.decode_batch = Histogram("freetoken_decode_batch_size", "sequences per decode step",
                                      buckets=BATCH_BUCKETS, registry=r)
        r.register(_Live(counters, stats))

    def finished(self, finish: str, prompt_tokens: int, generated: int) -> None:
        self.requests.labels(finish).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)

    def render(self) -> bytes:
        return generate_latest(self.registry)
