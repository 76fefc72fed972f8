"""The scaler's core: decide under one lock, record, start the action, end it.

One asyncio lock covers deciding and changing the state, so two webhooks that
arrive together are decided one after the other: the second sees the first's
action in flight and is declined `busy` (or `duplicate`).

A restart mid-action: start() finds the action still in flight in the state
file, audits it as `interrupted`, and runs the same playbook again with the
same variables (`resumed`): the playbooks are idempotent, so a second run
completes what the first began (a host half set up is set up; a drain already
done is a no-op). After max_attempts runs it is `abandoned`: membership is left
as it was before the action and the kind's cooldown starts. On shutdown the
running playbook is cancelled and the action stays in flight, to be resumed.

A failed action (failed, timeout past playbook_timeout_s, error, abandoned)
counts toward its kind and direction's failures in a row: the policy backs off
and, after max_failures, gives up on the alerts behind them (`gave_up`, audited
once when reached) until a success, a new firing, or reset_failures()
(POST /failures/reset). The metrics show the failures in a row, the give-up,
and when the run in flight started, for ScalerActionFailed, ScalerGaveUp and
ScalerStuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from llmfleet.serve.scaler import policy
from llmfleet.serve.scaler.audit import AuditLog
from llmfleet.serve.scaler.config import KindLimits, ScalerSettings
from llmfleet.serve.scaler.fleet import FleetSource
from llmfleet.serve.scaler.metrics import ScalerMetrics
from llmfleet.serve.scaler.payload import Notification
from llmfleet.serve.scaler.runner import PlaybookRunner, RunResult, run_spec
from llmfleet.serve.scaler.state import Action, State, StateStore, failure_key

log = logging.getLogger(__name__)


def new_action_id() -> str:
    """Sortable by time, unique: also the ansible-runner artifacts directory's name."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


@dataclass
class Scaler:
    settings: ScalerSettings
    runner: PlaybookRunner
    fleet: FleetSource
    metrics: ScalerMetrics
    clock: Any = time.time
    store: StateStore = field(init=False)
    audit: AuditLog = field(init=False)
    state: State = field(init=False, default_factory=State)
    _lock: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    _task: asyncio.Task[None] | None = field(init=False, default=None)
    _stopping: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.store = StateStore(self.settings.state_dir)
        self.audit = AuditLog(self.settings.state_dir / "audit.jsonl")
        self.metrics.timeout.set(self.settings.playbook_timeout_s)

    @property
    def limits(self) -> dict[str, KindLimits]:
        return {"workers": self.settings.workers, "engines": self.settings.engines}

    async def start(self) -> None:
        self.state = self.store.open()
        self.metrics.membership(self.state)
        self.metrics.failures(self.state, self.settings.max_failures)
        action = self.state.in_flight
        if action is None:
            return
        self.audit.write("interrupted", action=action.model_dump(mode="json"))
        if self.settings.dry_run:
            log.warning("action %s was interrupted; dry-run mode leaves it in flight, untouched", action.id)
            return
        if action.attempt >= self.settings.max_attempts:
            self.audit.write(
                "abandoned",
                action_id=action.id,
                attempts=action.attempt,
                reason="interrupted as often as max_attempts allows; membership left as before it",
            )
            self.metrics.actions.labels(kind=action.kind, direction=action.direction, result="abandoned").inc()
            self._end(action, succeeded=False)
            return
        action = action.model_copy(update={"attempt": action.attempt + 1})
        self._save(self.state.model_copy(update={"in_flight": action}))
        self.audit.write(
            "resumed",
            action_id=action.id,
            attempt=action.attempt,
            reason="the playbooks are idempotent: a second run completes what the interrupted one began",
        )
        self._launch(action)

    async def stop(self) -> None:
        """Cancel a running playbook (its action stays in flight, resumed at the next start) and let go of the state."""
        self._stopping = True
        if self._task is not None and not self._task.done():
            self.runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.store.close()

    async def handle(self, notification: Notification) -> list[dict[str, Any]]:
        """Decide on every alert of a notification; return the audit records of the decisions."""
        requests, declined = policy.classify(notification)
        records = [self._record(decision, 0.0) for decision in declined]
        async with self._lock:
            fleet: policy.Fleet | None = None
            fleet_error = ""
            if requests:
                try:
                    fleet = await self.fleet.load()
                except Exception as error:  # an unreadable inventory declines the request; the service carries on
                    fleet_error = f"inventory: {error}"
            for request in requests:
                began = time.monotonic()
                if fleet is None:
                    decision = policy.Decision(
                        "declined", "inventory", fleet_error, request.alerts, request.kind, request.direction
                    )
                else:
                    decision = policy.decide(
                        request,
                        self.state,
                        fleet,
                        self.limits,
                        self.clock(),
                        new_action_id(),
                        max_failures=self.settings.max_failures,
                        backoff_max_s=self.settings.backoff_max_s,
                    )
                if decision.action is not None and not self.settings.dry_run and not self._stopping:
                    self._save(policy.begin(self.state, decision.action))
                    self._launch(decision.action)
                records.append(self._record(decision, (time.monotonic() - began) * 1000))
        return records

    def _record(self, decision: policy.Decision, decide_ms: float) -> dict[str, Any]:
        record = self.audit.decision(decision, dry_run=self.settings.dry_run, decide_ms=decide_ms)
        self.metrics.decisions.labels(
            outcome=record["outcome"], code=decision.code, kind=decision.kind or "", direction=decision.direction or ""
        ).inc()
        log.info("%s %s %s: %s", record["outcome"], decision.kind, decision.direction, decision.reason)
        return record

    async def reset_failures(self, kind: str | None = None, direction: str | None = None) -> list[str]:
        """Forget the failures in a row of `kind` and `direction` (None: any): the operator's reset of a give-up."""
        async with self._lock:
            state, cleared = policy.reset_failures(self.state, kind, direction)
            if cleared:
                self._save(state)
            self.audit.write("reset", kind=kind, direction=direction, cleared=cleared)
        log.warning("failures reset by an operator: %s", ", ".join(cleared) or "none to reset")
        return cleared

    def _save(self, state: State) -> None:
        self.state = self.store.save(state)
        self.metrics.membership(self.state)
        self.metrics.failures(self.state, self.settings.max_failures)

    def _end(self, action: Action, *, succeeded: bool) -> None:
        """Finish the action in the state; audit `gave_up` when its failure is the max_failures-th in a row."""
        self._save(policy.finish(self.state, succeeded, self.clock(), self.limits))
        failed = self.state.failures.get(failure_key(action.kind, action.direction))
        if failed is not None and failed.count == self.settings.max_failures:
            self.audit.write(
                "gave_up",
                kind=action.kind,
                direction=action.direction,
                failures=failed.count,
                alert_keys=list(failed.alert_keys),
                reason="max_failures actions failed in a row: their alerts are declined until one fires anew,"
                " an action of this kind and direction succeeds, or POST /failures/reset",
            )
            log.error("gave up on %s %s after %d failed actions in a row", action.kind, action.direction, failed.count)

    def _launch(self, action: Action) -> None:
        # The start of this run (a resumed action's too): ScalerStuck compares it with playbook_timeout_s.
        self.metrics.started.set(self.clock())
        self._task = asyncio.create_task(self._run(action), name=f"scaler-action-{action.id}")

    async def _run(self, action: Action) -> None:
        spec = run_spec(action, self.settings)
        try:
            result = await self.runner.run(spec)
        except Exception as error:  # the runner's own failure ends the action as failed, never the service
            log.exception("action %s failed to run", action.id)
            result = RunResult("error", None, 0.0, detail=f"{type(error).__name__}: {error}")
        labels = {"kind": action.kind, "direction": action.direction, "result": result.status}
        self.metrics.actions.labels(**labels).inc()
        self.metrics.duration.labels(**labels).observe(result.duration_s)
        self.audit.write(
            "action_end",
            action_id=action.id,
            kind=action.kind,
            direction=action.direction,
            result=result.status,
            rc=result.rc,
            duration_s=round(result.duration_s, 3),
            artifacts=str(result.artifacts) if result.artifacts else None,
            detail=result.detail,
            playbook=spec.playbook,
            limit=spec.limit,
            tags=spec.tags,
        )
        if result.status == "canceled" and self._stopping:
            return  # stays in flight: the next start resumes it
        async with self._lock:
            self._end(action, succeeded=result.succeeded)
