"""The worker's Prometheus metrics (one registry per Worker, so tests can run several).

Lanes, models and engines come from settings, reasons and policies from fixed sets in the code.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmfleet.serve.queue.metrics import TOKEN_BUCKETS, MetricSet


class WorkerMetrics(MetricSet):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        # The lane's three signals, read from Redis in one step (Consumer.backlog): depth mixes waiting and
        # in-flight work and is kept for the dashboards; the alert rules read waiting, pending and the oldest
        # wait, which each mean one thing.
        self.queue_depth = self.gauge(
            "llmfleet_queue_depth", "Entries in one model's lane stream (waiting + in flight)", ["lane", "model"]
        )
        self.queue_pending = self.gauge(
            "llmfleet_queue_pending",
            "Entries in flight: delivered to a worker and not yet acknowledged",
            ["lane", "model"],
        )
        self.queue_waiting = self.gauge(
            "llmfleet_queue_waiting", "Entries waiting: queued and not yet taken by any worker", ["lane", "model"]
        )
        self.queue_oldest_wait = self.gauge(
            "llmfleet_queue_oldest_wait_seconds",
            "Age of the oldest entry not yet taken by any worker (0 when none waits)",
            ["lane", "model"],
        )
        self.inflight = self.gauge("llmfleet_worker_inflight", "Requests this worker is processing")
        self.capacity = self.gauge("llmfleet_worker_concurrency", "Requests this worker may process at once")
        self.draining = self.gauge("llmfleet_worker_draining", "1 while the worker drains after SIGTERM")
        self.queue_wait = self.histogram(
            "llmfleet_queue_wait_seconds", "Time from admission to the start of an attempt", ["lane"]
        )
        self.engine_time = self.histogram(
            "llmfleet_engine_seconds", "Time spent in engine calls for one attempt (retries included)", ["model"]
        )
        self.end_to_end = self.histogram(
            "llmfleet_request_seconds", "Time from admission to the delivered answer", ["model", "lane"]
        )
        # The per-model totals of the usage records (llmfleet/serve/queue/usage.py); the records themselves,
        # per subject and day, stay in Redis: no subject label here.
        self.usage_requests = self.counter(
            "llmfleet_usage_requests",
            "Requests answered (first result stored), by model and outcome (answered: 200, error: any other status)",
            ["model", "outcome"],
        )
        self.prompt_tokens = self.counter("llmfleet_prompt_tokens", "Prompt tokens of answered requests", ["model"])
        self.completion_tokens = self.counter(
            "llmfleet_completion_tokens", "Generated tokens of answered requests", ["model"]
        )
        self.prompt_token_sizes = self.histogram(
            "llmfleet_prompt_tokens_per_request", "Prompt tokens per request", ["model"], buckets=TOKEN_BUCKETS
        )
        self.errors = self.counter(
            "llmfleet_worker_errors",
            "Failures by reason (connect, timeout, engine_5xx, engine_4xx, no_engine, redis, fenced, malformed)",
            ["reason"],
        )
        self.results = self.counter(
            "llmfleet_worker_results",
            "Results by outcome: answer (first, delivered), duplicate (an earlier result won), fenced (not the owner)",
            ["outcome"],
        )
        self.redeliveries = self.counter(
            "llmfleet_worker_reclaimed", "Entries taken over from a worker that stopped touching them"
        )
        self.dead_letters = self.counter("llmfleet_dead_letters", "Entries moved to the dead-letter stream")
        self.cancelled = self.counter(
            "llmfleet_worker_cancelled",
            "Requests cancelled because the client went away (counted once the 499 is stored)",
        )
        self.handed_back = self.counter("llmfleet_worker_handed_back", "Entries handed back unfinished during a drain")
        self.engine_up = self.gauge(
            "llmfleet_engine_up", "1 when the engine is admitted (healthy, not ejected, not drained)", ["engine"]
        )
        # Drained is planned work (a rolling restart, a scale-in): EngineDown leaves out a drained engine.
        self.engine_drained = self.gauge(
            "llmfleet_engine_drained", "1 while the engine is in the queue's drained set (no new requests)", ["engine"]
        )
        self.engine_outstanding = self.gauge(
            "llmfleet_engine_outstanding", "Requests this worker has open on the engine", ["engine"]
        )
        self.engine_ejections = self.counter(
            "llmfleet_engine_ejections", "Times the engine was ejected after failed requests", ["engine"]
        )
        # policy is the model's balancing policy (least_outstanding or prefix_affinity): two values.
        self.engine_picks = self.counter(
            "llmfleet_engine_picks", "Engine choices for an attempt, by the policy that made them", ["engine", "policy"]
        )
        self.affinity_spills = self.counter(
            "llmfleet_engine_affinity_spills",
            "prefix_affinity choices the load bound moved past the key's first engine on the ring",
        )
