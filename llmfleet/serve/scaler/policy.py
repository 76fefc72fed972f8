"""The scaling policy as pure functions: notification + state + fleet + limits + now -> decisions.

Nothing here reads a clock, a file or the network; the service passes them in.

Order of the checks for one (direction, kind) request, first match wins:
1. `gave_up`: max_failures actions of this kind and direction failed in a row
   and every alert behind the request drove one of them. They are not tried
   again until an alert fires anew (a new startsAt: it resolved and came back,
   which earns one more attempt), an action of the kind and direction
   succeeds, or an operator resets the failures (POST /failures/reset).
2. `duplicate`: every alert behind it already drove an action that is still
   running or whose cooldown has not ended (an HA pair of Alertmanagers, or a
   retry, sends the same notification twice). Once the cooldown has passed, a
   still-firing alert counts again: a backlog that outlived one step of new
   capacity earns the next step, at the pace of Alertmanager's repeat_interval.
3. `busy`: one action at a time. A request while one runs is declined, not
   queued: Alertmanager repeats a firing alert, and the repeat after the action
   is judged on what the fleet is then, where a queued request would act on
   evidence from before the action.
4. `cooldown`: since the end of the last action of the same kind (either
   direction), cooldown_out_s before a scale-out, cooldown_in_s before a
   scale-in.
5. `backoff`: after failed actions of this kind and direction, the next one
   waits cooldown x 2^(failures - 1) from the end of the last failure, at most
   backoff_max_s (the first retry waits the cooldown, the second twice it,
   ...). A failure is a playbook that failed, ran past its timeout, could not
   start, or was abandoned after restarts.
6. bounds: `unknown_group` (the inventory lacks the groups), `at_max`,
   `at_min`, `no_standby` (no standby host left), `nothing_to_remove` (engine
   hosts the inventory itself places are never removed, only those the scaler
   added, last added first).
Then the action is `taken`.

Step sizing (scale-out), the way KEDA and the HPA size a step: desired =
ceil(load / what one unit carries), bounded by max. The scaling alerts carry
their figure as an annotation (roles/prometheus/vars/alerts.yml):
- workers: `scale_waiting`, the requests waiting in the queue. Requests wait
  while the engines have room only when every worker slot is taken, so each
  new worker takes worker_concurrency of them: each gateway host gets
  ceil(waiting / the slots one more worker per host brings) more workers, at
  least `step`, at most `max`.
- engines: `scale_running_per_engine` against `scale_running_target` (the
  rule's saturation point): desired hosts = ceil(hosts x running / target),
  at least one more, at most `max` and the standby hosts left. The playbook
  adds one host per action; the next follows after the cooldown while the
  alert still fires. The decision's reason names the desired count.
An alert without a usable figure (missing, not a number, negative) takes the
configured step: one host, or `step` workers per gateway host.

Alerts that are not scaling alerts (`not_scaling`), have an unknown kind or
action (`unknown_kind`), disagree with their name (`bad_labels`) or are
resolved (`resolved`: a resolved notification cancels nothing that runs)
are declined by classify() before any of this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from llmfleet.serve.scaler.config import DEFAULT_BACKOFF_MAX_S, DEFAULT_MAX_FAILURES, KindLimits
from llmfleet.serve.scaler.payload import Notification
from llmfleet.serve.scaler.state import Action, Direction, Failures, Kind, State, failure_key

SCALING_ALERTS: dict[str, Direction] = {"ScaleOutNeeded": "out", "ScaleInPossible": "in"}
KINDS: tuple[Kind, ...] = ("engines", "workers")
DIRECTIONS: tuple[Direction, ...] = ("out", "in")
Outcome = Literal["taken", "declined"]
# The annotations a scaling alert sizes its step with (roles/prometheus/vars/alerts.yml).
WAITING = "scale_waiting"
RUNNING_PER_ENGINE = "scale_running_per_engine"
RUNNING_TARGET = "scale_running_target"
FIGURES = (WAITING, RUNNING_PER_ENGINE, RUNNING_TARGET)
# 2^32 cooldowns is past any cap: the exponent stops there (a float cannot hold 2^2000).
_MAX_DOUBLINGS = 32


@dataclass(frozen=True)
class AlertRef:
    name: str
    fingerprint: str
    starts_at: str
    group_key: str

    @property
    def key(self) -> str:
        """What identifies one firing of one alert in one group, across repeated notifications."""
        return f"{self.group_key}|{self.fingerprint}|{self.starts_at}"


@dataclass(frozen=True)
class Request:
    kind: Kind
    direction: Direction
    alerts: tuple[AlertRef, ...]
    # The sizing figures the alerts carry (FIGURES), the largest of the alerts' usable values.
    figures: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    code: str
    reason: str
    alerts: tuple[AlertRef, ...]
    kind: str | None = None
    direction: str | None = None
    action: Action | None = None


@dataclass(frozen=True)
class Fleet:
    """The inventory as the scaler needs it. A group the inventory lacks is None."""

    engine_hosts: tuple[str, ...] | None
    standby_hosts: tuple[str, ...] | None
    gateway_workers: Mapping[str, int] | None = field(default=None)
    # Requests one worker processes at once (worker_concurrency), per gateway host.
    worker_concurrency: Mapping[str, int] | None = field(default=None)


def figure(text: str | None) -> float | None:
    """An annotation's number ("160", "1.5e+06"); None for a missing, non-numeric, negative or non-finite one."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def backoff_delay(failures: int, cooldown: float, cap: float) -> float:
    """Seconds the next action waits after `failures` failed ones in a row: cooldown x 2^(failures - 1), at most cap."""
    if failures < 1:
        return 0.0
    return float(min(cooldown * 2 ** min(failures - 1, _MAX_DOUBLINGS), cap))


def worker_step(waiting: float | None, slots_per_step: int, step: int) -> int:
    """Workers to add on each gateway host for `waiting` requests: ceil(waiting / slots_per_step), at least `step`.

    slots_per_step is what one more worker on every gateway host brings: the sum of their worker_concurrency.
    Without a usable figure (no waiting count, no slot count), the configured step.
    """
    if waiting is None or slots_per_step < 1:
        return step
    return max(step, math.ceil(waiting / slots_per_step))


def desired_engine_hosts(current: int, running_per_engine: float | None, target: float | None) -> int:
    """The HPA's desired = ceil(current x metric / target), and at least one host more (the alert asked for one).

    Without usable figures (or a zero target), one host more.
    """
    if running_per_engine is None or not target:
        return current + 1
    return max(current + 1, math.ceil(current * running_per_engine / target))


def reset_failures(state: State, kind: str | None = None, direction: str | None = None) -> tuple[State, list[str]]:
    """The state without the failures of `kind` and `direction` (None: any); and the keys cleared."""
    cleared = [
        key
        for key in state.failures
        if (kind is None or key.split("/")[0] == kind) and (direction is None or key.split("/")[1] == direction)
    ]
    kept = {key: value for key, value in state.failures.items() if key not in cleared}
    return state.model_copy(update={"failures": kept}), cleared


def classify(notification: Notification) -> tuple[list[Request], list[Decision]]:
    """Split a notification into scaling requests (one per direction and kind) and declined alerts."""
    declined: list[Decision] = []
    grouped: dict[tuple[Direction, Kind], list[AlertRef]] = {}
    figures: dict[tuple[Direction, Kind], dict[str, float]] = {}
    for alert in notification.alerts:
        ref = AlertRef(alert.name, alert.fingerprint, alert.startsAt.isoformat(), notification.groupKey)
        direction = SCALING_ALERTS.get(alert.name)
        action_label = alert.labels.get("scale_action")
        kind_label = alert.labels.get("scale_kind")
        if direction is None:
            name = alert.name or "an alert without a name"
            declined.append(_declined("not_scaling", f"{name} is not a scaling alert", ref))
        elif kind_label not in KINDS or action_label not in DIRECTIONS:
            declined.append(
                _declined(
                    "unknown_kind",
                    f"{alert.name}: scale_kind={kind_label!r} scale_action={action_label!r};"
                    f" expected scale_kind in {list(KINDS)} and scale_action in {list(DIRECTIONS)}",
                    ref,
                )
            )
        elif action_label != direction:
            declined.append(
                _declined("bad_labels", f"{alert.name}: scale_action={action_label!r}, expected {direction!r}", ref)
            )
        elif alert.status == "resolved":
            declined.append(
                Decision(
                    "declined",
                    "resolved",
                    "resolved: a resolved alert cancels nothing and starts nothing",
                    (ref,),
                    kind_label,
                    direction,
                )
            )
        else:
            grouped.setdefault((direction, kind_label), []).append(ref)
            found = figures.setdefault((direction, kind_label), {})
            for name in FIGURES:
                value = figure(alert.annotations.get(name))
                if value is not None:
                    found[name] = max(value, found.get(name, value))
    # Scale-out first (a backlog costs more than idle capacity), engines before workers.
    order = sorted(grouped, key=lambda pair: (DIRECTIONS.index(pair[0]), KINDS.index(pair[1])))
    requests = [
        Request(kind, direction, tuple(grouped[direction, kind]), figures[direction, kind]) for direction, kind in order
    ]
    return requests, declined


def _declined(code: str, reason: str, ref: AlertRef) -> Decision:
    return Decision("declined", code, reason, (ref,))


def decide(
    request: Request,
    state: State,
    fleet: Fleet,
    limits: Mapping[str, KindLimits],
    now: float,
    action_id: str,
    *,
    max_failures: int = DEFAULT_MAX_FAILURES,
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
) -> Decision:
    kind, direction, alerts = request.kind, request.direction, request.alerts

    def declined(code: str, reason: str) -> Decision:
        return Decision("declined", code, reason, alerts, kind, direction)

    keys = [alert.key for alert in alerts]
    failed = state.failures.get(failure_key(kind, direction))
    if failed is not None and failed.count >= max_failures and all(key in failed.alert_keys for key in keys):
        return declined(
            "gave_up",
            f"gave_up: {failed.count} {kind} {direction} actions failed in a row (max_failures {max_failures});"
            " these alerts are not acted on again until one fires anew (a new startsAt) or an operator resets"
            " the failures (POST /failures/reset)",
        )
    running = state.in_flight
    if all((running is not None and key in running.alert_keys) or state.acted.get(key, 0.0) > now for key in keys):
        return declined("duplicate", "duplicate: these alerts already drove an action that runs or is cooling down")
    if running is not None:
        return declined(
            "busy",
            f"busy: action {running.id} ({running.kind} {running.direction}) runs since {running.started_at:.0f};"
            " one action at a time, the alert will be judged again when Alertmanager repeats it",
        )
    bounds = limits[kind]
    cooldown = bounds.cooldown_out_s if direction == "out" else bounds.cooldown_in_s
    last = state.last_action_end.get(kind)
    if last is not None and now - last < cooldown:
        return declined(
            "cooldown",
            f"cooldown: {cooldown - (now - last):.0f} s left of the {cooldown:.0f} s {direction} cooldown of {kind}",
        )
    if failed is not None:
        delay = backoff_delay(failed.count, cooldown, backoff_max_s)
        if now - failed.last_end < delay:
            return declined(
                "backoff",
                f"backoff: {delay - (now - failed.last_end):.0f} s left of the {delay:.0f} s back-off after"
                f" {failed.count} failed {kind} {direction} action(s) in a row",
            )

    def taken(reason: str, host: str | None = None, worker_counts: dict[str, int] | None = None) -> Decision:
        action = Action(
            id=action_id,
            kind=kind,
            direction=direction,
            host=host,
            worker_counts=worker_counts or {},
            alert_keys=tuple(keys),
            alert_names=tuple(sorted({alert.name for alert in alerts})),
            started_at=now,
        )
        return Decision("taken", "taken", reason, alerts, kind, direction, action)

    if kind == "engines":
        if fleet.engine_hosts is None:
            return declined("unknown_group", "the inventory lacks the engine group")
        # A standby group the inventory lacks has no host left: ansible-inventory leaves out a group the
        # llmfleet_scaler plugin emptied by moving its last host into the engine group.
        standby = fleet.standby_hosts or ()
        engines = list(dict.fromkeys([*fleet.engine_hosts, *state.engines_added]))
        if direction == "out":
            if len(engines) >= bounds.max:
                return declined("at_max", f"at max engines: {len(engines)} engine hosts, max {bounds.max}")
            free = [host for host in standby if host not in engines]
            if not free:
                return declined("no_standby", "no standby host left (none in the standby group, or no such group)")
            running_per_engine = request.figures.get(RUNNING_PER_ENGINE)
            running_target = request.figures.get(RUNNING_TARGET)
            desired = min(
                desired_engine_hosts(len(engines), running_per_engine, running_target),
                bounds.max,
                len(engines) + len(free),
            )
            why = (
                f"{running_per_engine:g} requests running per engine against a target of {running_target:g}"
                if running_per_engine is not None and running_target
                else "no load figure in the alert"
            )
            return taken(
                f"add {free[0]} as an engine host: {desired} engine hosts wanted ({why}, within max {bounds.max}"
                f" and {len(free)} standby left); one host per action, the next after the cooldown while the alert"
                " fires",
                host=free[0],
            )
        if not state.engines_added:
            return declined(
                "nothing_to_remove",
                "no engine host added by the scaler (hosts the inventory puts in the engine group stay)",
            )
        if len(engines) - 1 < bounds.min:
            return declined("at_min", f"at min engines: {len(engines)} engine hosts, min {bounds.min}")
        host = state.engines_added[-1]
        return taken(f"drain and stop {host}, back to standby", host=host)
    if not fleet.gateway_workers:
        return declined("unknown_group", "the inventory has no gateway host to change the workers of")
    current = {host: state.worker_counts.get(host, count) for host, count in fleet.gateway_workers.items()}
    sizing = ""
    if direction == "out":
        waiting = request.figures.get(WAITING)
        slots = sum((fleet.worker_concurrency or {}).get(host, 0) for host in current)
        step = worker_step(waiting, slots, bounds.step)
        if waiting is not None and slots > 0:
            sizing = f" (+{step} per gateway host for {waiting:g} requests waiting; one more on each: {slots} slots)"
        else:
            sizing = f" (+{step} per host, the configured step: no waiting count in the alert)"
        target = {host: min(count + step, bounds.max) for host, count in current.items()}
        if target == current:
            return declined("at_max", f"at max workers: {bounds.max} per gateway host")
    else:
        target = {host: max(count - bounds.step, bounds.min) for host, count in current.items()}
        if target == current:
            return declined("at_min", f"at min workers: {bounds.min} per gateway host")
    changes = ", ".join(f"{host} {current[host]}->{target[host]}" for host in target if target[host] != current[host])
    return taken(f"workers: {changes}{sizing}", worker_counts=target)


def begin(state: State, action: Action) -> State:
    """The state with `action` in flight (saved before its playbook starts)."""
    return state.model_copy(update={"in_flight": action})


def finish(state: State, succeeded: bool, now: float, limits: Mapping[str, KindLimits]) -> State:
    """End the action in flight: commit its membership if it succeeded, else leave membership as it was.

    Either way the kind's cooldown starts now (a failing playbook is not retried
    in a tight loop), and the alerts behind it stay duplicates until it ends.
    A failure adds one to its kind and direction's failures in a row (the
    back-off and the give-up read them), with the alerts behind it; a success
    clears them.
    """
    action = state.in_flight
    if action is None:
        return state
    engines = list(state.engines_added)
    counts = dict(state.worker_counts)
    if succeeded and action.kind == "engines" and action.host:
        if action.direction == "out" and action.host not in engines:
            engines.append(action.host)
        elif action.direction == "in" and action.host in engines:
            engines.remove(action.host)
    if succeeded and action.kind == "workers":
        counts.update(action.worker_counts)
    bounds = limits[action.kind]
    until = now + (bounds.cooldown_out_s if action.direction == "out" else bounds.cooldown_in_s)
    acted = {key: end for key, end in state.acted.items() if end > now}
    acted.update(dict.fromkeys(action.alert_keys, until))
    failures = dict(state.failures)
    key = failure_key(action.kind, action.direction)
    previous = failures.pop(key, None)
    if not succeeded:
        failures[key] = Failures(
            count=(previous.count if previous else 0) + 1,
            last_end=now,
            alert_keys=tuple(dict.fromkeys([*(previous.alert_keys if previous else ()), *action.alert_keys])),
        )
    return state.model_copy(
        update={
            "in_flight": None,
            "engines_added": tuple(engines),
            "worker_counts": counts,
            "last_action_end": {**state.last_action_end, action.kind: now},
            "acted": acted,
            "failures": failures,
        }
    )
