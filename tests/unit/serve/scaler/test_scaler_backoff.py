"""A failed action backs off exponentially, and after max_failures in a row the scaler gives up on its alerts.

The failures are counted per kind and direction in the state file; a success
or an operator's reset clears them, and an alert that fires anew (a new
startsAt) earns one more attempt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmfleet.serve.scaler.config import KindLimits
from llmfleet.serve.scaler.payload import Notification
from llmfleet.serve.scaler.policy import (
    Decision,
    Fleet,
    Request,
    backoff_delay,
    begin,
    classify,
    decide,
    finish,
    reset_failures,
)
from llmfleet.serve.scaler.state import Failures, State, StateStore, load
from tests.scaler_tools import alert, notification

COOLDOWN = 300.0
LIMITS = {
    "workers": KindLimits(min=1, max=8, cooldown_out_s=COOLDOWN, cooldown_in_s=1800),
    "engines": KindLimits(min=1, max=3, cooldown_out_s=COOLDOWN, cooldown_in_s=1800),
}
FLEET = Fleet(("gpu1",), ("gpu3",), {"gw1": 1}, {"gw1": 32})
T0 = 1_000_000.0


def request(kind: str = "engines", starts_at: str = "2026-12-01T10:00:00Z", fingerprint: str = "f1") -> Request:
    raw = alert("ScaleOutNeeded", kind, "out", starts_at=starts_at, fingerprint=fingerprint)
    requests, _ = classify(Notification.model_validate(notification(raw)))
    return requests[0]


def judge(req: Request, state: State, now: float, **policy: Any) -> Decision:
    return decide(req, state, FLEET, LIMITS, now, f"a{now:.0f}", **policy)


def run_and_end(req: Request, state: State, now: float, *, succeeded: bool, duration: float = 60.0) -> State:
    """Take the request at `now` (it must be taken), run it for `duration`, end it."""
    decision = judge(req, state, now)
    assert decision.action is not None, decision.reason
    return finish(begin(state, decision.action), succeeded, now + duration, LIMITS)


@pytest.mark.parametrize(
    ("failures", "cooldown", "cap", "delay"),
    [
        (0, 300, 3600, 0),
        (1, 300, 3600, 300),  # the first retry waits the cooldown
        (2, 300, 3600, 600),
        (3, 300, 3600, 1200),
        (5, 300, 3600, 3600),  # 4800, capped
        (10_000, 300, 3600, 3600),  # no overflow however many
        (3, 0, 3600, 0),  # no cooldown, no back-off (give-up still bounds the attempts)
    ],
)
def test_backoff_doubles_the_cooldown_per_failure_up_to_the_cap(
    failures: int, cooldown: float, cap: float, delay: float
) -> None:
    assert backoff_delay(failures, cooldown, cap) == delay


def test_finish_counts_failures_in_a_row_with_their_alerts_and_a_success_clears_them() -> None:
    first, refired = request(), request(starts_at="2026-12-01T11:00:00Z")
    state = run_and_end(first, State(), T0, succeeded=False)
    assert state.failures == {"engines/out": Failures(count=1, last_end=T0 + 60, alert_keys=(first.alerts[0].key,))}
    state = run_and_end(refired, state, T0 + 1000, succeeded=False)
    failed = state.failures["engines/out"]
    assert (failed.count, failed.last_end) == (2, T0 + 1060)
    assert failed.alert_keys == (first.alerts[0].key, refired.alerts[0].key)
    # Another kind's success leaves them alone; the same kind and direction's success clears them.
    state = run_and_end(request("workers"), state, T0 + 2000, succeeded=True)
    assert state.failures["engines/out"].count == 2
    state = run_and_end(first, state, T0 + 5000, succeeded=True)
    assert state.failures == {}


def test_a_failing_alert_is_retried_after_an_exponential_backoff_then_given_up() -> None:
    req = request()
    end1 = T0 + 60
    state = run_and_end(req, State(), T0, succeeded=False)
    # Failure 1: the cooldown is the back-off; the repeat of the same alert is a duplicate meanwhile.
    assert judge(req, state, end1 + 100).code == "duplicate"
    end2 = end1 + COOLDOWN + 60
    state = run_and_end(req, state, end1 + COOLDOWN, succeeded=False)
    # Failure 2: the cooldown has passed, the back-off (2 x cooldown) has not.
    waiting = judge(req, state, end2 + COOLDOWN)
    assert (waiting.outcome, waiting.code) == ("declined", "backoff")
    assert waiting.reason.startswith("backoff: 300 s left of the 600 s back-off after 2 failed engines out")
    state = run_and_end(req, state, end2 + 2 * COOLDOWN, succeeded=False)
    # Failure 3 (max_failures): given up on that alert, however long after.
    for later in (1, 10_000, 10**7):
        gave_up = judge(req, state, state.failures["engines/out"].last_end + later)
        assert (gave_up.outcome, gave_up.code) == ("declined", "gave_up")
    assert "3 engines out actions failed in a row (max_failures 3)" in gave_up.reason
    assert state.failures["engines/out"].count == 3


def test_the_give_up_holds_for_every_failed_alert_and_lifts_for_a_new_firing() -> None:
    first, second = request(fingerprint="a"), request(fingerprint="b")
    state = State(failures={"engines/out": Failures(count=3, last_end=T0, alert_keys=(first.alerts[0].key,))})
    assert judge(first, state, T0 + 10**6).code == "gave_up"
    # Another alert (here: another fingerprint) drove no failure: it is judged, after the back-off of 3 failures.
    assert judge(second, state, T0 + 1000).code == "backoff"
    assert judge(second, state, T0 + 4 * COOLDOWN).outcome == "taken"
    # The same alert, resolved and firing again (a new startsAt), earns one more attempt; failing it, it is given up.
    refired = request(fingerprint="a", starts_at="2026-12-01T12:00:00Z")
    state = run_and_end(refired, state, T0 + 4 * COOLDOWN, succeeded=False)
    assert state.failures["engines/out"].count == 4
    assert judge(refired, state, T0 + 10**6).code == "gave_up"
    # Another kind or direction is not held back by it.
    assert judge(request("workers"), state, T0 + 10**6).outcome == "taken"


def test_max_failures_and_the_cap_are_settings() -> None:
    req = request()
    state = State(failures={"engines/out": Failures(count=3, last_end=T0, alert_keys=(req.alerts[0].key,))})
    assert judge(req, state, T0 + 10**6, max_failures=3).code == "gave_up"
    # With max_failures 5 the same history only backs off: 4 x cooldown, capped at 500 s.
    assert judge(req, state, T0 + 400, max_failures=5, backoff_max_s=500).code == "backoff"
    assert judge(req, state, T0 + 500, max_failures=5, backoff_max_s=500).outcome == "taken"


@pytest.mark.parametrize(
    ("kind", "direction", "cleared"),
    [
        (None, None, ["engines/out", "workers/in", "workers/out"]),
        ("workers", None, ["workers/in", "workers/out"]),
        (None, "out", ["engines/out", "workers/out"]),
        ("engines", "in", []),
    ],
)
def test_reset_clears_the_failures_of_a_kind_and_direction(
    kind: str | None, direction: str | None, cleared: list[str]
) -> None:
    history = {
        key: Failures(count=3, last_end=T0, alert_keys=("k",)) for key in ("engines/out", "workers/in", "workers/out")
    }
    state, keys = reset_failures(State(failures=history), kind, direction)
    assert sorted(keys) == cleared
    assert sorted(state.failures) == sorted(set(history) - set(cleared))


def test_after_a_reset_the_given_up_alert_is_acted_on_again() -> None:
    req = request()
    state = State(failures={"engines/out": Failures(count=3, last_end=T0, alert_keys=(req.alerts[0].key,))})
    assert judge(req, state, T0 + 10_000).code == "gave_up"
    state, _ = reset_failures(state)
    assert judge(req, state, T0 + 10_000).outcome == "taken"


def test_a_state_file_written_before_failures_were_recorded_still_loads(tmp_path: Path) -> None:
    # The shape of a state file from before this change: no `failures` key.
    old = {
        "version": 1,
        "engines_added": ["gpu3"],
        "worker_counts": {"gw1": 3},
        "last_action_end": {"engines": 5.0},
        "acted": {},
        "in_flight": None,
        "membership": {"engine_hosts": ["gpu3"], "worker_counts": {"gw1": 3}},
    }
    (tmp_path / "state.json").write_text(json.dumps(old))
    state = load(tmp_path / "state.json")
    assert state.failures == {} and state.engines_added == ("gpu3",)
    # Saved again, the failures round-trip.
    store = StateStore(tmp_path)
    store.open()
    store.save(state.model_copy(update={"failures": {"engines/out": Failures(count=2, last_end=9.0)}}))
    store.close()
    assert load(tmp_path / "state.json").failures == {"engines/out": Failures(count=2, last_end=9.0)}
