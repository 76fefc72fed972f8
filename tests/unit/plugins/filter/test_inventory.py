"""Unit tests for plugins/filter/inventory.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

_SPEC = importlib.util.spec_from_file_location(
    "llmfleet_filter_inventory", Path(__file__).parents[4] / "plugins" / "filter" / "inventory.py"
)
assert _SPEC and _SPEC.loader
inventory = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(inventory)

REQUIRED = ["gpu_nodes", "gpu_standby", "gateways", "redis", "monitoring"]
RULES = {
    "required": REQUIRED,
    "non_empty": ["gpu_nodes", "gateways", "redis", "monitoring"],
    "single_host": ["redis"],
    "exclusive": [["gpu_nodes", "gpu_standby"]],
}
SOUND = {
    "all": ["gw1", "redis1", "mon1", "gpu1", "gpu2", "gpu3"],
    "ungrouped": [],
    "gateways": ["gw1"],
    "redis": ["redis1"],
    "monitoring": ["mon1"],
    "gpu_nodes": ["gpu1", "gpu2"],
    "gpu_standby": ["gpu3"],
}


def test_sound_inventory_has_no_problems() -> None:
    assert inventory.inventory_problems(SOUND, **RULES) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"gpu_nodes": None}, "group 'gpu_nodes' is missing"),
        ({"gpu_standby": None}, "group 'gpu_standby' is missing"),
        ({"gateways": [], "all": SOUND["all"][1:]}, "group 'gateways' has no hosts"),
        (
            {"redis": ["redis1", "redis2"], "all": [*SOUND["all"], "redis2"]},
            "group 'redis' must have exactly one host, has 2: redis1, redis2",
        ),
        ({"gpu_standby": ["gpu2"], "all": SOUND["all"][:-1]}, "host 'gpu2' is in both 'gpu_nodes' and 'gpu_standby'"),
        ({"all": [*SOUND["all"], "stray"], "ungrouped": ["stray"]}, "host 'stray' is in none of the groups"),
    ],
)
def test_broken_inventory_is_named(change: dict[str, list[str] | None], expected: str) -> None:
    groups = {**SOUND, **change}
    groups = {name: hosts for name, hosts in groups.items() if hosts is not None}
    problems = inventory.inventory_problems(groups, **RULES)
    # The named problem comes first; a missing group also orphans its hosts.
    assert problems, "a broken inventory must be reported"
    assert expected in problems[0]


def test_gpu_standby_may_be_empty() -> None:
    groups = {**SOUND, "gpu_standby": [], "all": SOUND["all"][:-1]}
    assert inventory.inventory_problems(groups, **RULES) == []


def test_rejects_what_is_not_the_groups_mapping() -> None:
    with pytest.raises(AnsibleFilterError, match="expects the `groups` mapping"):
        inventory.inventory_problems(["gw1"], **RULES)  # type: ignore[arg-type]
