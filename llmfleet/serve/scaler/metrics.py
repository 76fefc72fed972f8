"""The scaler's Prometheus metrics, llmfleet_scaler_* (one registry per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmfleet.serve.queue.metrics import MetricSet
from llmfleet.serve.scaler.state import State, failure_key

# A playbook run takes seconds (workers) to many minutes (a new engine host).
ACTION_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
KINDS = ("engines", "workers")
DIRECTIONS = ("out", "in")
# An action's result: ansible-runner's status (successful, failed, timeout, canceled: a shutdown, resumed at the
# next start), `error` (the run could not start), `abandoned` (interrupted max_attempts times). Every series
# exists from the start at 0, so that increase() sees a first failure (a series born at 1 shows no increase).
RESULTS = ("successful", "failed", "timeout", "error", "canceled", "abandoned")


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
        self.started = self.gauge(
            "llmfleet_scaler_action_started_timestamp_seconds",
            "When the playbook run in flight started (Unix time); 0 when none runs",
        )
        self.timeout = self.gauge(
            "llmfleet_scaler_playbook_timeout_seconds", "The longest a playbook run may take before it is cancelled"
        )
        self.consecutive_failures = self.gauge(
            "llmfleet_scaler_consecutive_failures",
            "Failed actions in a row by kind and direction since the last success or reset",
            ["kind", "direction"],
        )
        self.gave_up = self.gauge(
            "llmfleet_scaler_gave_up",
            "1 while the scaler declines the alerts behind max_failures failed actions in a row (gave_up)",
            ["kind", "direction"],
        )
        for kind in KINDS:
            for direction in DIRECTIONS:
                for result in RESULTS:
                    self.actions.labels(kind=kind, direction=direction, result=result)
                self.consecutive_failures.labels(kind=kind, direction=direction)
                self.gave_up.labels(kind=kind, direction=direction)

    def membership(self, state: State) -> None:
        effective = state.effective()
        self.engines_added.set(len(effective.engine_hosts))
        for host, count in effective.worker_counts.items():
            self.workers.labels(host=host).set(count)
        self.running.set(1 if state.in_flight is not None else 0)
        if state.in_flight is None:
            self.started.set(0)

    def failures(self, state: State, max_failures: int) -> None:
        for kind in KINDS:
            for direction in DIRECTIONS:
                failed = state.failures.get(failure_key(kind, direction))
                count = failed.count if failed else 0
                self.consecutive_failures.labels(kind=kind, direction=direction).set(count)
                self.gave_up.labels(kind=kind, direction=direction).set(1 if count >= max_failures else 0)
