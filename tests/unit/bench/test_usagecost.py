"""`llmfleet bench usage`: how its rounds become the figures, and what it refuses (no Redis here).

The benchmark itself runs against a real redis-server in
tests/integration/serve/gateway/test_usage_scripts.py.
"""

from __future__ import annotations

import argparse

import pytest

from llmfleet.bench.usagecost import Round, summarize, table
from llmfleet.bench.usagecost import run as run_bench
from llmfleet.errors import LlmfleetError


def round_of(arm: str, path_ms: float, scripts_ms: float) -> Round:
    """A round of 1000 requests that took path_ms of CPU a request (half here, half in Redis), scripts_ms in scripts.

    Over 1000 requests, the milliseconds a request are the round's seconds.
    """
    return Round(arm, 1000, client_cpu_s=path_ms / 2, redis_cpu_s=path_ms / 2, scripts_s=scripts_ms)


def test_the_cost_is_the_median_of_the_pairs_differences_not_of_the_arms_medians() -> None:
    # The path slows as Redis fills: each pair differs by 0.03 ms, the arms' medians by more.
    rounds = [
        round_of("records", 1.03, 0.13),
        round_of("baseline", 1.00, 0.10),
        round_of("baseline", 1.20, 0.12),
        round_of("records", 1.23, 0.15),
        round_of("records", 1.43, 0.17),
        round_of("baseline", 1.40, 0.14),
    ]
    summary = summarize(rounds, python_cost_ms=0.001)
    assert summary.cost_ms == pytest.approx(0.03)
    assert summary.cost_quartiles_ms == pytest.approx((0.03, 0.03))
    assert summary.scripts_cost_ms == pytest.approx(0.03)
    assert summary.records_ms == pytest.approx(1.23)
    assert summary.baseline_ms == pytest.approx(1.20)
    assert summary.records_scripts_ms == pytest.approx(0.15)
    assert summary.python_cost_ms == 0.001


def test_a_disturbed_pair_moves_the_quartiles_not_the_median() -> None:
    differences = [0.02, 0.03, 0.04, 0.5]  # the last pair ran beside something else
    rounds = [r for d in differences for r in (round_of("records", 1 + d, 0.1), round_of("baseline", 1, 0.1))]
    summary = summarize(rounds, python_cost_ms=0.0)
    assert summary.cost_ms == pytest.approx(0.035)
    low, high = summary.cost_quartiles_ms
    assert low < summary.cost_ms < high
    assert high > 0.04


def test_the_report_says_whether_the_target_is_met_and_where_the_cost_goes() -> None:
    cheap = summarize([round_of("records", 1.05, 0.13), round_of("baseline", 1.0, 0.1)], python_cost_ms=0.0007)
    assert "+50.0 us of CPU a request" in table(cheap)
    assert "target under 100 us: met" in table(cheap)
    assert "30.0 us inside Redis's scripts" in table(cheap)
    assert "0.7 us building DELIVER's arguments" in table(cheap)
    dear = summarize([round_of("records", 1.2, 0.13), round_of("baseline", 1.0, 0.1)], python_cost_ms=0.0)
    assert "target under 100 us: missed" in table(dear)


def test_arms_with_unequal_rounds_are_refused() -> None:
    with pytest.raises(LlmfleetError, match="as many rounds each"):
        summarize([round_of("records", 1.0, 0.1)], python_cost_ms=0.0)


@pytest.mark.parametrize(("rounds", "requests"), [(0, 500), (4, 99)])
def test_too_small_a_run_is_refused_before_redis_starts(rounds: int, requests: int) -> None:
    with pytest.raises(LlmfleetError, match="at least 1 pair and --requests of at least 100"):
        run_bench(argparse.Namespace(rounds=rounds, requests=requests, out="unused.json"))
