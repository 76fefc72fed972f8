"""The gateway role's preflight checks the token budgets before anything changes.

`llmfleet usage budget apply` would refuse a bad document only after the
gateways restarted; the preflight says what the variables must look like
first. It runs for real through ansible-playbook on localhost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.roles.test_gateway_jwt_preflight import SECRET, _jwt_check

TASK = "gateway : preflight | Check the token budgets"


@pytest.mark.parametrize(
    "variables",
    [
        {"gateway_tier_budgets": {"free": {"daily": -1}}},
        {"gateway_tier_budgets": {"free": {"weekly": 1000}}},
        {"gateway_subject_budgets": {"alice": {"daily": "lots"}}},
        {"gateway_subject_budgets": {"alice": 1000}},
        {"gateway_tier_budgets": ["free"]},
    ],
    ids=["negative", "unknown period", "not a number", "not a mapping", "a list"],
)
def test_bad_budgets_are_refused_with_their_shape(tmp_path: Path, variables: dict[str, Any]) -> None:
    task = _jwt_check(tmp_path, TASK, gateway_jwt_secret=SECRET, **variables)
    assert "fatal: [localhost]" in task, task
    assert "map a tier or a subject to {daily: N, monthly: N}" in " ".join(task.split()), task


@pytest.mark.parametrize(
    "variables",
    [
        {},
        {
            "gateway_tier_budgets": {"free": {"daily": 200000, "monthly": 3000000}, "gold": {"monthly": 0}},
            "gateway_subject_budgets": {"alice": {"daily": 50000}},
        },
    ],
    ids=["none (the defaults)", "per tier and subject"],
)
def test_good_budgets_pass(tmp_path: Path, variables: dict[str, Any]) -> None:
    task = _jwt_check(tmp_path, TASK, gateway_jwt_secret=SECRET, **variables)
    assert "ok: [localhost]" in task and "fatal" not in task, task
