"""The scaling policy as pure functions: classify a notification, decide, begin and finish an action."""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.serve.scaler.config import KindLimits
from llmfleet.serve.scaler.payload import Notification
from llmfleet.serve.scaler.policy import Decision, Fleet, Request, begin, classify, decide, finish
from llmfleet.serve.scaler.state import State
from tests.scaler_tools import alert, notification

LIMITS = {
    "workers": KindLimits(min=1, max=4, step=1, cooldown_out_s=300, cooldown_in_s=1800),
    "engines": KindLimits(min=1, max=3, cooldown_out_s=300, cooldown_in_s=1800),
}
FLEET = Fleet(engine_hosts=("gpu1", "gpu2"), standby_hosts=("gpu3",), gateway_workers={"gw1": 2, "gw2": 1})
NOW = 1_000_000.0


def parse(*alerts: dict[str, Any]) -> Notification:
    return Notification.model_validate(notification(*alerts))


def one_request(*alerts: dict[str, Any]) -> Request:
    requests, declined = classify(parse(*alerts))
    assert declined == []
    assert len(requests) == 1
    return requests[0]


def run(request: Request, state: State | None = None, fleet: Fleet = FLEET, now: float = NOW) -> Decision:
    return decide(request, state or State(), fleet, LIMITS, now, "a1")


@pytest.mark.parametrize(
    ("labels", "code"),
    [
        ({"name": "QueueBacklogHigh", "kind": None, "action": None}, "not_scaling"),
        ({"name": "ScaleOutNeeded", "kind": "gpus"}, "unknown_kind"),
        ({"name": "ScaleOutNeeded", "kind": None}, "unknown_kind"),
        ({"name": "ScaleOutNeeded", "action": "sideways"}, "unknown_kind"),
        ({"name": "ScaleOutNeeded", "action": "in"}, "bad_labels"),
        ({"name": "ScaleInPossible", "action": "out"}, "bad_labels"),
        ({"name": "ScaleOutNeeded", "status": "resolved"}, "resolved"),
    ],
)
def test_classify_declines_what_is_no_scaling_request(labels: dict[str, Any], code: str) -> None:
    requests, declined = classify(parse(alert(**labels)))
    assert requests == []
    assert [d.code for d in declined] == [code]
    assert declined[0].outcome == "declined"
    assert declined[0].alerts[0].fingerprint == "f1"


def test_classify_groups_by_direction_and_kind_out_first_engines_first() -> None:
    requests, declined = classify(
        parse(
            alert("ScaleInPossible", "workers", "in", fingerprint="a"),
            alert("ScaleOutNeeded", "workers", "out", fingerprint="b"),
            alert("ScaleOutNeeded", "engines", "out", fingerprint="c"),
            alert("ScaleOutNeeded", "engines", "out", fingerprint="d"),
            alert("EngineDown", None, None, fingerprint="e"),
        )
    )
    assert [(r.direction, r.kind, [a.fingerprint for a in r.alerts]) for r in requests] == [
        ("out", "engines", ["c", "d"]),
        ("out", "workers", ["b"]),
        ("in", "workers", ["a"]),
    ]
    assert [d.code for d in declined] == ["not_scaling"]


@pytest.mark.parametrize(
    ("kind", "action", "expected"),
    [
        # The queue backs up while the engines have room: workers are the bottleneck.
        ("workers", "out", {"worker_counts": {"gw1": 3, "gw2": 2}, "host": None}),
        ("workers", "in", {"worker_counts": {"gw1": 1, "gw2": 1}, "host": None}),
        # The engines are saturated: the next standby host becomes an engine host.
        ("engines", "out", {"worker_counts": {}, "host": "gpu3"}),
    ],
)
def test_the_alert_labels_pick_the_kind_of_capacity(kind: str, action: str, expected: dict[str, Any]) -> None:
    name = "ScaleOutNeeded" if action == "out" else "ScaleInPossible"
    decision = run(one_request(alert(name, kind, action)))
    assert decision.outcome == "taken", decision.reason
    assert decision.action is not None
    assert (decision.action.kind, decision.action.direction) == (kind, action)
    assert {"worker_counts": decision.action.worker_counts, "host": decision.action.host} == expected


@pytest.mark.parametrize(
    ("kind", "action", "state", "fleet", "code"),
    [
        ("engines", "out", State(), Fleet(("gpu1",), (), {"gw1": 1}), "no_standby"),
        ("engines", "out", State(engines_added=("gpu3",)), FLEET, "at_max"),
        ("engines", "out", State(), Fleet(("gpu1", "gpu2", "gpu4"), ("gpu3",), {}), "at_max"),
        ("engines", "out", State(), Fleet(None, None, {"gw1": 1}), "unknown_group"),
        ("engines", "in", State(), FLEET, "nothing_to_remove"),
        ("engines", "in", State(engines_added=("gpu3",)), Fleet((), ("gpu3",), {}), "at_min"),
        ("workers", "out", State(worker_counts={"gw1": 4, "gw2": 4}), FLEET, "at_max"),
        ("workers", "in", State(worker_counts={"gw1": 1}), Fleet((), (), {"gw1": 3}), "at_min"),
        ("workers", "out", State(), Fleet(("gpu1",), (), None), "unknown_group"),
        ("workers", "out", State(), Fleet(("gpu1",), (), {}), "unknown_group"),
    ],
)
def test_bounds(kind: str, action: str, state: State, fleet: Fleet, code: str) -> None:
    name = "ScaleOutNeeded" if action == "out" else "ScaleInPossible"
    decision = run(one_request(alert(name, kind, action)), state, fleet)
    assert (decision.outcome, decision.code) == ("declined", code), decision.reason
    assert decision.action is None


def test_no_standby_host_left_is_said_so() -> None:
    decision = run(one_request(alert(kind="engines")), State(engines_added=("gpu3",)), Fleet(("gpu1",), ("gpu3",), {}))
    assert decision.reason == "no standby host left (none in the standby group, or no such group)"


def test_a_standby_group_emptied_by_the_scale_out_still_lets_the_host_be_removed() -> None:
    # The inventory plugin moved gpu3, the only standby host, into the engine group: ansible-inventory then
    # lists no standby group at all (seen in the lab). Scale-in must still take gpu3 back; scale-out has none left.
    state, fleet = State(engines_added=("gpu3",)), Fleet(("gpu1", "gpu3"), None, {"gw1": 1})
    scale_in = run(one_request(alert("ScaleInPossible", "engines", "in")), state, fleet)
    assert scale_in.action is not None and scale_in.action.host == "gpu3"
    scale_out = run(one_request(alert(kind="engines")), state, fleet)
    assert scale_out.code == "no_standby"


def test_workers_stop_at_max_on_each_host_and_change_only_those_below() -> None:
    decision = run(one_request(alert()), State(worker_counts={"gw1": 4}))
    assert decision.action is not None
    assert decision.action.worker_counts == {"gw1": 4, "gw2": 2}


def test_engines_scale_in_removes_the_last_host_the_scaler_added_only() -> None:
    state = State(engines_added=("gpu3", "gpu4"))
    fleet = Fleet(("gpu1", "gpu3", "gpu4"), (), {"gw1": 1})
    decision = run(one_request(alert("ScaleInPossible", "engines", "in")), state, fleet)
    assert decision.action is not None and decision.action.host == "gpu4"


def test_one_action_at_a_time_a_second_alert_is_busy() -> None:
    first = run(one_request(alert(kind="engines", fingerprint="e1")))
    assert first.action is not None
    state = begin(State(), first.action)
    second = run(one_request(alert(kind="workers", fingerprint="w1")), state, now=NOW + 1)
    assert (second.outcome, second.code) == ("declined", "busy")
    assert first.action.id in second.reason


def test_a_repeat_of_the_running_alert_is_a_duplicate() -> None:
    request = one_request(alert(kind="engines"))
    first = run(request)
    assert first.action is not None
    repeat = run(request, begin(State(), first.action), now=NOW + 30)
    assert repeat.code == "duplicate"


def test_dedupe_by_group_key_fingerprint_and_starts_at() -> None:
    request = one_request(alert(kind="workers"))
    first = run(request)
    assert first.action is not None
    done = finish(begin(State(), first.action), True, NOW + 60, LIMITS)
    # The same alert (same group, fingerprint, startsAt) again inside the cooldown: a duplicate.
    assert run(request, done, now=NOW + 120).code == "duplicate"
    # Another firing of it (new startsAt) inside the cooldown: judged, and cooling down.
    refired = one_request(alert(kind="workers", starts_at="2026-12-01T10:30:00Z"))
    assert run(refired, done, now=NOW + 120).code == "cooldown"
    # In another group, the same fingerprint is another alert.
    other_group = Notification.model_validate(notification(alert(kind="workers"), group_key="{}:{other}"))
    assert decide(classify(other_group)[0][0], done, FLEET, LIMITS, NOW + 120, "a2").code == "cooldown"
    # After the cooldown a still-firing alert counts again: the backlog outlived one step.
    again = run(request, done, now=NOW + 60 + 301)
    assert again.outcome == "taken"


@pytest.mark.parametrize(
    ("kind", "action", "since_end", "outcome"),
    [
        ("workers", "out", 299, "declined"),
        ("workers", "out", 300, "taken"),
        ("workers", "in", 1799, "declined"),
        ("workers", "in", 1800, "taken"),
        ("engines", "out", 10, "declined"),
        ("engines", "out", 301, "taken"),
    ],
)
def test_cooldown_per_kind_from_the_end_of_its_last_action(
    kind: str, action: str, since_end: float, outcome: str
) -> None:
    state = State(last_action_end={kind: NOW - since_end}, engines_added=("gpu3",), worker_counts={"gw1": 3})
    fleet = Fleet(("gpu1",), ("gpu3", "gpu4"), {"gw1": 3})
    name = "ScaleOutNeeded" if action == "out" else "ScaleInPossible"
    decision = run(one_request(alert(name, kind, action)), state, fleet)
    assert decision.outcome == outcome, decision.reason
    if outcome == "declined":
        assert decision.code == "cooldown"


def test_a_cooldown_of_one_kind_does_not_hold_the_other() -> None:
    state = State(last_action_end={"engines": NOW - 1})
    assert run(one_request(alert(kind="workers")), state).outcome == "taken"


def test_finish_commits_membership_on_success_only() -> None:
    out = run(one_request(alert(kind="engines")))
    assert out.action is not None
    running = begin(State(), out.action)
    # In flight, the host is already an engine host to the playbook and the plugin.
    assert running.effective().engine_hosts == ("gpu3",)
    assert running.engines_added == ()
    done = finish(running, True, NOW + 600, LIMITS)
    assert done.engines_added == ("gpu3",) and done.in_flight is None
    assert done.last_action_end == {"engines": NOW + 600}
    failed = finish(running, False, NOW + 600, LIMITS)
    assert failed.engines_added == () and failed.effective().engine_hosts == ()
    assert failed.last_action_end == {"engines": NOW + 600}, "a failed action cools down too"


def test_finish_of_a_scale_in_gives_the_host_back_to_standby() -> None:
    state = State(engines_added=("gpu3",))
    decision = run(one_request(alert("ScaleInPossible", "engines", "in")), state, Fleet(("gpu1", "gpu3"), (), {}))
    assert decision.action is not None
    running = begin(state, decision.action)
    assert running.effective().engine_hosts == ("gpu3",), "kept until drained and stopped"
    assert finish(running, True, NOW, LIMITS).engines_added == ()


def test_resolved_cancels_nothing_that_runs() -> None:
    out = run(one_request(alert(kind="engines")))
    assert out.action is not None
    running = begin(State(), out.action)
    requests, declined = classify(parse(alert(kind="engines", status="resolved")))
    assert requests == [] and [d.code for d in declined] == ["resolved"]
    # Nothing in classify's result touches the state: the action is still in flight.
    assert running.in_flight == out.action
