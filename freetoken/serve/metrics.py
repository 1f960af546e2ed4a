"""/metrics in the Prometheus text format (prometheus_client), one registry per server.

freetoken_*: requests and tokens, time to first token and inter-token latency, running / waiting requests, the
decode batch size, structured-output replies that failed their own check, and the engine's expert-cache (hits,
misses, hit rate, misses computed on the CPU) and prefix-cache counters read at scrape time.
vllm:*: the series vLLM's Grafana dashboard reads, under vLLM's names with a model_name label: running / waiting,
KV-cache usage, prompt / generation tokens, finished requests by reason, and the latency histograms (time to first
token, inter-token, end-to-end, queue, prefill, decode) and request-length histograms."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
REQUEST_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # vLLM's request-latency buckets
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Live:
    """Values owned by the service and the engine, read when scraped."""

    def __init__(self, counters, stats: Callable[[], dict], kv_usage: Callable[[], float], model: str):
        self.counters, self.stats, self.kv_usage, self.model = counters, stats, kv_usage, model

    def _gauge(self, name: str, doc: str, value: float, vllm: bool = False):
        g = GaugeMetricFamily(name, doc, labels=["model_name"] if vllm else None)
        g.add_metric([self.model] if vllm else [], value)
        return g

    def collect(self):
        c = self.counters
        yield self._gauge("freetoken_requests_running", "requests generating now", c.running)
        yield self._gauge("freetoken_requests_waiting", "requests queued for a slot", c.waiting)
        yield self._gauge("vllm:num_requests_running", "requests generating now", c.running, vllm=True)
        yield self._gauge("vllm:num_requests_waiting", "requests queued for a slot", c.waiting, vllm=True)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV tokens held (running sequences and the prefix cache) over "
                                                      "the planned KV tokens, 0..1", self.kv_usage(), vllm=True)
        yield CounterMetricFamily("freetoken_requests_rejected", "requests refused because the queue was full",
                                  value=c.rejected)
        yield CounterMetricFamily("freetoken_requests_cancelled", "requests whose client left before the end",
                                  value=c.cancelled)
        stats = self.stats()
        experts = stats.get("expert_cache") or {}
        for key, name, doc in (("hits", "hits", "expert accesses served from a device slot"),
                               ("misses", "misses", "expert accesses fetched or run on the CPU"),
                               ("cpu", "cpu_misses", "expert misses computed on the CPU (not fetched)"),
                               ("fetched_bytes", "fetched_bytes", "expert bytes copied into device slots")):
            if key in experts:
                yield CounterMetricFamily(f"freetoken_expert_cache_{name}", doc, value=experts[key])
        if "hit_rate" in experts:
            yield self._gauge("freetoken_expert_cache_hit_rate", "expert-cache hits over accesses since start",
                              experts["hit_rate"])
        prefix = stats.get("prefix_cache") or {}
        for key, doc in (("lookups", "prefix-cache lookups"),
                         ("hit_lookups", "prefix-cache lookups that reused at least one token"),
                         ("anchor_hits", "prefix-cache lookups that reused up to at least one message boundary"),
                         ("snapshot_hits", "prefix-cache lookups that resumed from a recurrent-state snapshot"),
                         ("reused_tokens", "prompt tokens served from the prefix cache"),
                         ("computed_tokens", "prompt tokens prefilled")):
            if key in prefix:
                yield CounterMetricFamily(f"freetoken_prefix_cache_{key}", doc, value=prefix[key])
        if "reused_tokens" in prefix:  # vLLM counts queried and hit tokens
            for name, value in (("queries", prefix["reused_tokens"] + prefix.get("computed_tokens", 0)),
                                ("hits", prefix["reused_tokens"])):
                m = CounterMetricFamily(f"vllm:prefix_cache_{name}", f"prompt tokens {name} in the prefix cache",
                                        labels=["model_name"])
                m.add_metric([self.model], value)
                yield m


class _Twin:
    """One observation into freetoken's histogram and vLLM's."""

    def __init__(self, *hists):
        self.hists = hists

    def observe(self, value: float) -> None:
        for h in self.hists:
            h.observe(value)


class Metrics:
    def __init__(self, counters, stats: Callable[[], dict], kv_usage: Callable[[], float] = lambda: 0.0,
                 model: str = ""):
        self.registry = r = CollectorRegistry()
        self.model = model
        self.requests = Counter("freetoken_requests", "finished requests by finish reason", ["finish"], registry=r)
        self.prompt_tokens = Counter("freetoken_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("freetoken_generation_tokens", "generated tokens", registry=r)
        self.structured_invalid = Counter("freetoken_structured_output_invalid", "constrained replies that failed "
                                          "their own check (jsonschema, re, ...) and were refused", ["kind"],
                                          registry=r)
        self.decode_batch = Histogram("freetoken_decode_batch_size", "sequences per decode step",
                                      buckets=BATCH_BUCKETS, registry=r)

        def vllm(cls, name, doc, **kw):
            return cls(f"vllm:{name}", doc, ["model_name"], registry=r, **kw).labels(model)

        self.ttft = _Twin(Histogram("freetoken_time_to_first_token_seconds", "request arrival to its first token",
                                    buckets=LATENCY_BUCKETS, registry=r),
                          vllm(Histogram, "time_to_first_token_seconds", "time to first token",
                               buckets=LATENCY_BUCKETS))
        self.inter_token = _Twin(Histogram("freetoken_inter_token_latency_seconds", "time between a request's "
                                           "tokens", buckets=LATENCY_BUCKETS, registry=r),
                                 vllm(Histogram, "inter_token_latency_seconds", "inter-token latency",
                                      buckets=LATENCY_BUCKETS))
        self.e2e = vllm(Histogram, "e2e_request_latency_seconds", "arrival to last token", buckets=REQUEST_BUCKETS)
        self.queue = vllm(Histogram, "request_queue_time_seconds", "arrival to a running slot",
                          buckets=REQUEST_BUCKETS)
        self.prefill = vllm(Histogram, "request_prefill_time_seconds", "running slot to first token",
                            buckets=REQUEST_BUCKETS)
        self.decode = vllm(Histogram, "request_decode_time_seconds", "first token to last token",
                           buckets=REQUEST_BUCKETS)
        self.prompt_len = vllm(Histogram, "request_prompt_tokens", "prompt tokens per sequence",
                               buckets=LENGTH_BUCKETS)
        self.gen_len = vllm(Histogram, "request_generation_tokens", "generated tokens per sequence",
                            buckets=LENGTH_BUCKETS)
        self.vllm_prompt = vllm(Counter, "prompt_tokens", "prompt tokens processed")
        self.vllm_generation = vllm(Counter, "generation_tokens", "generated tokens")
        self.success = Counter("vllm:request_success", "finished sequences by reason", ["model_name",
                                                                                        "finished_reason"],
                               registry=r)
        r.register(_Live(counters, stats, kv_usage, model))

    def finished(self, finish: str, prompt_tokens: int, generated: int) -> None:
        """One sequence done."""
        self.requests.labels(finish).inc()
        self.success.labels(self.model, finish).inc()
        for counter, value in ((self.prompt_tokens, prompt_tokens), (self.generation_tokens, generated),
                               (self.vllm_prompt, prompt_tokens), (self.vllm_generation, generated)):
            counter.inc(value)
        self.prompt_len.observe(prompt_tokens)
        self.gen_len.observe(generated)

    def request_done(self, arrived: float, started: float, first: float | None, end: float) -> None:
        """A whole request: its queue, prefill and decode times and end-to-end latency (perf_counter seconds)."""
        first = end if first is None else first
        self.e2e.observe(end - arrived)
        self.queue.observe(started - arrived)
        self.prefill.observe(first - started)
        self.decode.observe(end - first)

    def render(self) -> bytes:
        return generate_latest(self.registry)
