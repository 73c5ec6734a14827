"""Prometheus metrics, one registry per app (two servers in one process never collide)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
TPF_BUCKETS = (0.5, 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)


class ServerMetrics:
    """All series are prefixed ``dllm_``; see docs/serving.md for what each one means."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("dllm_requests", "HTTP requests to the API, by endpoint", ["endpoint"], registry=r)
        self.errors = Counter("dllm_request_errors", "Error responses, by endpoint and HTTP status",
                              ["endpoint", "status"], registry=r)
        self.latency = Histogram("dllm_request_latency_seconds", "Time from request to last byte (successful requests)",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("dllm_time_to_first_token_seconds", "Time from request to the first committed text",
                              ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.forwards = Histogram("dllm_forwards_per_request", "Model forwards per completed choice (NFE)",
                                  buckets=COUNT_BUCKETS, registry=r)
        self.tpf = Histogram("dllm_tokens_per_forward", "Completion tokens per forward, per completed choice",
                             buckets=TPF_BUCKETS, registry=r)
        self.batch_size = Histogram("dllm_batch_size", "Rows per generate call (rows that joined it mid-call included)",
                                    buckets=COUNT_BUCKETS, registry=r)
        self.joined_rows = Counter("dllm_joined_rows", "Rows that joined a generate call already running",
                                   registry=r)
        self.generate_seconds = Histogram("dllm_generate_seconds", "Wall time of each decoding batch",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.forward_seconds = Counter("dllm_forward_seconds", "Time spent in model forwards (as decoding reports it)",
                                       registry=r)
        self.queue_depth = Gauge("dllm_queue_depth", "Requests waiting for a batch", registry=r)
        self.running_rows = Gauge("dllm_running_rows", "Rows in the generate call now running", registry=r)
        self.active_branches = Gauge("dllm_active_branches",
                                     "LoPA branches being verified now (rows x (lopa_branches + 1 anchor); 0 without LoPA)",
                                     registry=r)
        self.prompt_tokens = Counter("dllm_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("dllm_generation_tokens", "Completion tokens returned", registry=r)
        self.cancelled_rows = Counter("dllm_cancelled_rows", "Rows cancelled because their client went away",
                                      registry=r)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
