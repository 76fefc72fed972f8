"""playbooks/gpu_hosts.yml changes GPU hosts one at a time, their engines drained around it.

The nvidia_driver role may reboot a host. Without `serial`, a driver bump
would reboot every serving host at once; without the drain, the requests
running there would be cut. The lab runs this play with every host in one
batch (tests/lab/helpers.py: gpu_hosts_serial=100%), so nothing there would
notice either going away: these tests read the play as Ansible does.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

PLAYS = yaml.safe_load((REPO_ROOT / "playbooks" / "gpu_hosts.yml").read_text())
ROTATION = "tasks/engine_rotation.yml"


def _play() -> dict[str, Any]:
    changing = [play for play in PLAYS if any(_role(entry) == "nvidia_driver" for entry in play.get("roles", []))]
    assert len(changing) == 1, "one play of gpu_hosts.yml should apply nvidia_driver"
    return changing[0]


def _role(entry: Any) -> str:
    return str(entry if isinstance(entry, str) else entry.get("role") or entry.get("name"))


def _template(expression: Any, variables: dict[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    value = trust_as_template(expression) if isinstance(expression, str) else expression
    return Templar(loader=DataLoader(), variables=variables).template(value)


@pytest.mark.parametrize(
    ("variables", "serial", "max_fail"),
    [
        ({}, 1, 0),
        ({"gpu_hosts_serial": 2, "gpu_hosts_max_fail_percentage": 25}, 2, 25),
        ({"gpu_hosts_serial": "100%"}, "100%", 0),
    ],
)
def test_one_host_at_a_time_stopping_at_the_first_failure(
    variables: dict[str, Any], serial: Any, max_fail: int
) -> None:
    play = _play()
    assert str(_template(play["serial"], variables)) == str(serial)
    assert int(_template(play["max_fail_percentage"], variables)) == max_fail


def _rotation_steps(tasks: list[dict[str, Any]], variables: dict[str, Any]) -> list[str]:
    """engines_rotation of each task that includes the rotation task file."""
    steps = []
    for task in tasks:
        include = task.get("ansible.builtin.include_tasks")
        if include is None:
            continue
        file = include["file"] if isinstance(include, dict) else include
        if _template(file, variables) == ROTATION:
            steps.append(task["vars"]["engines_rotation"])
    return steps


def test_engines_are_drained_before_the_roles_and_undrained_after() -> None:
    play = _play()
    # The task files the play includes when the site names none of its own.
    variables = {name: _template(play["vars"][name], {}) for name in ("__gpu_hosts_drain", "__gpu_hosts_undrain")}
    assert _rotation_steps(play.get("pre_tasks", []), variables) == ["drain"]
    assert _rotation_steps(play.get("post_tasks", []), variables) == ["undrain"]
    assert not _rotation_steps(play.get("tasks", []), variables)


def test_only_a_serving_host_with_engines_is_drained() -> None:
    play = _play()
    serving = play["vars"]["__gpu_hosts_serving"]
    groups = {"gpu_nodes": ["gpu-01"], "gpu_standby": ["gpu-03"]}
    engines = [{"name": "chat", "model": "m", "port": 8000}]

    def drains(host: str, **more: Any) -> bool:
        value = _template(serving, {"inventory_hostname": host, "groups": groups, **more})
        return str(value).strip().lower() == "true"

    assert drains("gpu-01", vllm_engines=engines)
    assert not drains("gpu-01", vllm_engines=[])
    assert not drains("gpu-03", vllm_engines=engines)
