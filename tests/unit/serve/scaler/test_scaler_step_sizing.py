"""Step sizing of a scale-out: desired = ceil(load / what one unit carries), bounded by max and the standby hosts.

The figures come from ScaleOutNeeded's annotations (scale_waiting for workers,
scale_running_per_engine and scale_running_target for engines); an alert
without a usable one takes the configured step.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmfleet.serve.scaler.config import KindLimits
from llmfleet.serve.scaler.payload import Notification
from llmfleet.serve.scaler.policy import (
    Fleet,
    Request,
    classify,
    decide,
    desired_engine_hosts,
    figure,
    worker_step,
)
from llmfleet.serve.scaler.state import State
from tests.scaler_tools import alert, notification

NOW = 1_000_000.0
LIMITS = {
    "workers": KindLimits(min=1, max=8, step=1),
    "engines": KindLimits(min=1, max=10),
}
# Two gateway hosts at 2 and 1 workers of 32 slots each: one more worker on each brings 64 slots.
FLEET = Fleet(
    engine_hosts=("gpu1", "gpu2"),
    standby_hosts=("gpu3", "gpu4", "gpu5"),
    gateway_workers={"gw1": 2, "gw2": 1},
    worker_concurrency={"gw1": 32, "gw2": 32},
)


def scale_out(kind: str, fingerprint: str = "f1", **annotations: str) -> dict[str, Any]:
    raw = alert("ScaleOutNeeded", kind, "out", fingerprint=fingerprint)
    raw["annotations"].update(annotations)
    return raw


def request_of(*alerts: dict[str, Any]) -> Request:
    requests, declined = classify(Notification.model_validate(notification(*alerts)))
    assert declined == [] and len(requests) == 1
    return requests[0]


@pytest.mark.parametrize(
    ("waiting", "slots", "step", "expected"),
    [
        (160.0, 64, 1, 3),  # 160 waiting, 64 slots per worker added on each host: 3 more on each
        (64.0, 64, 1, 1),
        (65.0, 64, 1, 2),
        (3.0, 64, 1, 1),  # a short queue that ages: the configured step
        (10.0, 32, 4, 4),  # never under the configured step
        (0.0, 64, 2, 2),
        (None, 64, 2, 2),  # no figure: the configured step
        (500.0, 0, 1, 1),  # no slot count: the configured step
    ],
)
def test_worker_step_is_the_backlog_over_the_slots_one_more_worker_brings(
    waiting: float | None, slots: int, step: int, expected: int
) -> None:
    assert worker_step(waiting, slots, step) == expected


@pytest.mark.parametrize(
    ("current", "running", "target", "expected"),
    [
        (2, 256.0, 200.0, 3),  # 2 hosts at 1.28x their saturation point: ceil(2.56)
        (2, 3.0, 1.0, 6),  # the HPA's ceil(current x metric / target)
        (4, 150.0, 200.0, 5),  # fired for KV cache or engine queues, under the running target: one more
        (2, None, 200.0, 3),  # no figure: one more
        (2, 5.0, 0.0, 3),  # a zero target is no target
    ],
)
def test_desired_engine_hosts_follow_the_hpa_rule_and_ask_for_at_least_one(
    current: int, running: float | None, target: float | None, expected: int
) -> None:
    assert desired_engine_hosts(current, running, target) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [("160", 160.0), ("2.5", 2.5), ("1.5e+06", 1.5e6), (" 7 ", 7.0), ("0", 0.0)]
    + [(bad, None) for bad in (None, "", "many", "NaN", "+Inf", "-1", "{{ $value }}")],
)
def test_an_annotation_is_a_figure_only_when_a_finite_non_negative_number(
    text: str | None, value: float | None
) -> None:
    assert figure(text) == value


def test_a_backlog_sizes_the_workers_step_within_max() -> None:
    # 300 waiting over 64 slots per step: ceil(4.7) = 5 more workers on each gateway host, at most 8.
    decision = decide(request_of(scale_out("workers", scale_waiting="300")), State(), FLEET, LIMITS, NOW, "a1")
    assert decision.outcome == "taken", decision.reason
    assert decision.action is not None and decision.action.worker_counts == {"gw1": 7, "gw2": 6}
    assert "+5 per gateway host for 300 requests waiting" in decision.reason
    bigger = decide(request_of(scale_out("workers", scale_waiting="5000")), State(), FLEET, LIMITS, NOW, "a2")
    assert bigger.action is not None and bigger.action.worker_counts == {"gw1": 8, "gw2": 8}


@pytest.mark.parametrize(
    ("annotations", "fleet"),
    [
        ({}, FLEET),  # an alert from rules older than the annotation
        ({"scale_waiting": "lots"}, FLEET),
        ({"scale_waiting": "300"}, Fleet(("gpu1",), (), {"gw1": 2, "gw2": 1}, None)),  # concurrency unknown
    ],
    ids=["no annotation", "not a number", "no worker concurrency"],
)
def test_without_a_usable_figure_the_workers_step_is_the_configured_one(
    annotations: dict[str, str], fleet: Fleet
) -> None:
    limits = {**LIMITS, "workers": KindLimits(min=1, max=8, step=2)}
    decision = decide(request_of(scale_out("workers", **annotations)), State(), fleet, limits, NOW, "a1")
    assert decision.action is not None and decision.action.worker_counts == {"gw1": 4, "gw2": 3}
    assert "the configured step" in decision.reason


def test_the_largest_figure_of_the_alerts_in_one_request_sizes_it() -> None:
    request = request_of(
        scale_out("workers", fingerprint="a", scale_waiting="40"),
        scale_out("workers", fingerprint="b", scale_waiting="200"),
        scale_out("workers", fingerprint="c", scale_waiting="garbage"),
    )
    assert request.figures == {"scale_waiting": 200.0}
    decision = decide(request, State(), FLEET, LIMITS, NOW, "a1")
    assert decision.action is not None and decision.action.worker_counts == {"gw1": 6, "gw2": 5}


def test_engines_compute_the_desired_count_and_add_one_host_per_action() -> None:
    request = request_of(scale_out("engines", scale_running_per_engine="3", scale_running_target="1"))
    decision = decide(request, State(), FLEET, LIMITS, NOW, "a1")
    assert decision.action is not None and decision.action.host == "gpu3"
    # ceil(2 x 3 / 1) = 6, bounded by the 2 + 3 hosts there are.
    assert "5 engine hosts wanted (3 requests running per engine against a target of 1" in decision.reason
    assert "one host per action, the next after the cooldown" in decision.reason
    # Bounded by max too.
    limits = {**LIMITS, "engines": KindLimits(min=1, max=4)}
    capped = decide(request, State(), FLEET, limits, NOW, "a2")
    assert capped.action is not None and capped.action.host == "gpu3"
    assert "4 engine hosts wanted" in capped.reason


def test_engines_without_figures_want_one_host_more() -> None:
    decision = decide(request_of(scale_out("engines")), State(), FLEET, LIMITS, NOW, "a1")
    assert decision.action is not None and decision.action.host == "gpu3"
    assert "3 engine hosts wanted (no load figure in the alert" in decision.reason


def test_scale_in_keeps_the_configured_step() -> None:
    raw = alert("ScaleInPossible", "workers", "in")
    raw["annotations"]["scale_waiting"] = "500"  # not a scale-in figure: ignored
    decision = decide(request_of(raw), State(), FLEET, LIMITS, NOW, "a1")
    assert decision.action is not None and decision.action.worker_counts == {"gw1": 1, "gw2": 1}
