"""The scaling policy as pure functions: notification + state + fleet + limits + now -> decisions.

Nothing here reads a clock, a file or the network; the service passes them in.

Order of the checks for one (direction, kind) request, first match wins:
1. `duplicate`: every alert behind it already drove an action that is still
   running or whose cooldown has not ended (an HA pair of Alertmanagers, or a
   retry, sends the same notification twice). Once the cooldown has passed, a
   still-firing alert counts again: a backlog that outlived one step of new
   capacity earns the next step, at the pace of Alertmanager's repeat_interval.
2. `busy`: one action at a time. A request while one runs is declined, not
   queued: Alertmanager repeats a firing alert, and the repeat after the action
   is judged on what the fleet is then, where a queued request would act on
   evidence from before the action.
3. `cooldown`: since the end of the last action of the same kind (either
   direction), cooldown_out_s before a scale-out, cooldown_in_s before a
   scale-in.
4. bounds: `unknown_group` (the inventory lacks the groups), `at_max`,
   `at_min`, `no_standby` (no standby host left), `nothing_to_remove` (engine
   hosts the inventory itself places are never removed, only those the scaler
   added, last added first).
Then the action is `taken`.

Alerts that are not scaling alerts (`not_scaling`), have an unknown kind or
action (`unknown_kind`), disagree with their name (`bad_labels`) or are
resolved (`resolved`: a resolved notification cancels nothing that runs)
are declined by classify() before any of this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from llmfleet.serve.scaler.config import KindLimits
from llmfleet.serve.scaler.payload import Notification
from llmfleet.serve.scaler.state import Action, Direction, Kind, State

SCALING_ALERTS: dict[str, Direction] = {"ScaleOutNeeded": "out", "ScaleInPossible": "in"}
KINDS: tuple[Kind, ...] = ("engines", "workers")
DIRECTIONS: tuple[Direction, ...] = ("out", "in")
Outcome = Literal["taken", "declined"]


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


def classify(notification: Notification) -> tuple[list[Request], list[Decision]]:
    """Split a notification into scaling requests (one per direction and kind) and declined alerts."""
    declined: list[Decision] = []
    grouped: dict[tuple[Direction, Kind], list[AlertRef]] = {}
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
    # Scale-out first (a backlog costs more than idle capacity), engines before workers.
    order = sorted(grouped, key=lambda pair: (DIRECTIONS.index(pair[0]), KINDS.index(pair[1])))
    return [Request(kind, direction, tuple(grouped[direction, kind])) for direction, kind in order], declined


def _declined(code: str, reason: str, ref: AlertRef) -> Decision:
    return Decision("declined", code, reason, (ref,))


def decide(
    request: Request,
    state: State,
    fleet: Fleet,
    limits: Mapping[str, KindLimits],
    now: float,
    action_id: str,
) -> Decision:
    kind, direction, alerts = request.kind, request.direction, request.alerts

    def declined(code: str, reason: str) -> Decision:
        return Decision("declined", code, reason, alerts, kind, direction)

    keys = [alert.key for alert in alerts]
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
            return taken(f"add {free[0]} as an engine host", host=free[0])
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
    if direction == "out":
        target = {host: min(count + bounds.step, bounds.max) for host, count in current.items()}
        if target == current:
            return declined("at_max", f"at max workers: {bounds.max} per gateway host")
    else:
        target = {host: max(count - bounds.step, bounds.min) for host, count in current.items()}
        if target == current:
            return declined("at_min", f"at min workers: {bounds.min} per gateway host")
    changes = ", ".join(f"{host} {current[host]}->{target[host]}" for host in target if target[host] != current[host])
    return taken(f"workers: {changes}", worker_counts=target)


def begin(state: State, action: Action) -> State:
    """The state with `action` in flight (saved before its playbook starts)."""
    return state.model_copy(update={"in_flight": action})


def finish(state: State, succeeded: bool, now: float, limits: Mapping[str, KindLimits]) -> State:
    """End the action in flight: commit its membership if it succeeded, else leave membership as it was.

    Either way the kind's cooldown starts now (a failing playbook is not retried
    in a tight loop), and the alerts behind it stay duplicates until it ends.
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
    return state.model_copy(
        update={
            "in_flight": None,
            "engines_added": tuple(engines),
            "worker_counts": counts,
            "last_action_end": {**state.last_action_end, action.kind: now},
            "acted": acted,
        }
    )
