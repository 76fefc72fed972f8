"""The gateway's Prometheus metrics (one registry per app; labels never carry subjects or ids)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmfleet.serve.queue.metrics import TOKEN_BUCKETS, MetricSet


class GatewayMetrics(MetricSet):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.requests = self.counter(
            "llmfleet_gateway_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
        )
        self.latency = self.histogram(
            "llmfleet_gateway_request_seconds", "Time to the end of the response, by route template", ["route"]
        )
        self.admitted = self.counter(
            "llmfleet_gateway_admitted",
            "Requests queued, by model, lane and mode (sync, stream, task)",
            ["model", "lane", "mode"],
        )
        self.rejected = self.counter(
            "llmfleet_gateway_rejected",
            "Requests refused before queueing, by reason (auth, forbidden, invalid, context_length, rate_limit,"
            " budget, concurrency, queue_full, no_engine, redis, busy: no free connection in the Redis pool)",
            ["reason"],
        )
        self.prompt_tokens = self.histogram(
            "llmfleet_gateway_prompt_tokens", "Prompt tokens counted at admission", ["model"], buckets=TOKEN_BUCKETS
        )
        self.waiting = self.gauge(
            "llmfleet_gateway_waiting", "Clients waiting for a queued request's answer (or stream)"
        )
        self.cancelled = self.counter(
            "llmfleet_gateway_cancelled", "Requests cancelled because the client went away or timed out", ["reason"]
        )
        self.replayed = self.counter(
            "llmfleet_gateway_replayed",
            "Retries answered with an earlier request's answer (Idempotency-Key), by model and mode",
            ["model", "mode"],
        )
        self.lost = self.counter(
            "llmfleet_gateway_lost",
            "Admitted requests whose job Redis no longer had (restarted without its latest writes), answered with a"
            " retryable 503 request_lost, by mode (sync, stream, task, replay)",
            ["mode"],
        )
        self.redis_up = self.gauge("llmfleet_gateway_redis_up", "1 when the reply stream reader is connected")
