"""The scaler's Prometheus metrics, llmfleet_scaler_* (one registry per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmfleet.serve.queue.metrics import MetricSet
from llmfleet.serve.scaler.state import State

# A playbook run takes seconds (workers) to many minutes (a new engine host).
ACTION_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)


class ScalerMetrics(MetricSet):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.notifications = self.counter(
            "llmfleet_scaler_notifications",
            "Webhook calls by result (accepted, unauthorized, malformed, too_large)",
            ["result"],
        )
        self.decisions = self.counter(
            "llmfleet_scaler_decisions",
            "Decisions by outcome (taken, declined, dry_run), reason code, kind and direction",
            ["outcome", "code", "kind", "direction"],
        )
        self.running = self.gauge("llmfleet_scaler_actions_running", "Scaling actions running now (0 or 1)")
        self.actions = self.counter(
            "llmfleet_scaler_actions", "Finished actions by kind, direction and result", ["kind", "direction", "result"]
        )
        self.duration = self.histogram(
            "llmfleet_scaler_action_duration_seconds",
            "Time a scaling action's playbook ran",
            ["kind", "direction", "result"],
            buckets=ACTION_BUCKETS,
        )
        self.engines_added = self.gauge(
            "llmfleet_scaler_engine_hosts_added", "Standby hosts serving as engine hosts (committed and in flight)"
        )
        self.workers = self.gauge(
            "llmfleet_scaler_worker_count", "Worker count the scaler set per gateway host", ["host"]
        )

    def membership(self, state: State) -> None:
        effective = state.effective()
        self.engines_added.set(len(effective.engine_hosts))
        for host, count in effective.worker_counts.items():
            self.workers.labels(host=host).set(count)
        self.running.set(1 if state.in_flight is not None else 0)
