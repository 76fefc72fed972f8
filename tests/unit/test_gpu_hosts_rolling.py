"""playbooks/gpu_hosts.yml changes GPU hosts one at a time, their engines drained around it.

The nvidia_driver role may reboot a host. Without `serial`, a driver bump
would reboot every serving host at once; without the drain, the requests
running there would be cut; without the silence, every upgrade would page.
The lab runs this play with every host in one batch (tests/lab/helpers.py:
gpu_hosts_serial=100%), so nothing there would notice either going away: these
tests read the play as Ansible does.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

PLAYS = yaml.safe_load((REPO_ROOT / "playbooks" / "gpu_hosts.yml").read_text())
ROTATION = "tasks/engine_rotation.yml"
SILENCE = "tasks/maintenance_silence.yml"


def _play() -> dict[str, Any]:
    changing = [play for play in PLAYS if "nvidia_driver" in _steps(play.get("tasks", []), {})[0]]
    assert len(changing) == 1, "one play of gpu_hosts.yml should apply nvidia_driver"
    return changing[0]


def _steps(tasks: list[dict[str, Any]], variables: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What the tasks do, in order: each role they import, `drain`/`undrain` (the rotation task file) and
    `silence:create`/`silence:expire` (the maintenance silence task file); then the same of every always:."""
    steps: list[str] = []
    always: list[str] = []
    for task in tasks:
        if "block" in task:
            inner, inner_always = _steps(task["block"], variables)
            steps += inner
            always += inner_always + _steps(task.get("always", []), variables)[0]
            continue
        role = task.get("ansible.builtin.import_role")
        if role is not None:
            steps.append(role["name"])
        include = task.get("ansible.builtin.include_tasks")
        if include is None:
            continue
        file = include["file"] if isinstance(include, dict) else include
        file = _template(file, variables) if variables else file
        if file == ROTATION:
            steps.append(task["vars"]["engines_rotation"])
        elif file == SILENCE:
            steps.append(f"silence:{task['vars']['maintenance_silence']}")
    return steps, always


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


def test_engines_are_drained_before_the_roles_and_undrained_after() -> None:
    play = _play()
    # The task files the play includes when the site names none of its own.
    variables = {name: _template(play["vars"][name], {}) for name in ("__gpu_hosts_drain", "__gpu_hosts_undrain")}
    steps, _ = _steps(play["tasks"], variables)
    rotation = [step for step in steps if step in ("drain", "undrain")]
    assert rotation == ["drain", "undrain"], steps
    roles = [step for step in steps if step not in ("drain", "undrain") and not step.startswith("silence:")]
    assert "nvidia_driver" in roles and "docker" in roles, steps
    assert steps.index("drain") < min(steps.index(role) for role in roles), steps
    assert steps.index("undrain") > max(steps.index(role) for role in roles), steps


def test_the_host_is_silenced_from_before_its_drain_and_the_silence_lifted_on_failure_too() -> None:
    play = _play()
    variables = {name: _template(play["vars"][name], {}) for name in ("__gpu_hosts_drain", "__gpu_hosts_undrain")}
    steps, always = _steps(play["tasks"], variables)
    assert steps[0] == "silence:create", steps
    assert "silence:expire" not in steps, "the silence is lifted in always:, which runs on failure too"
    assert always == ["silence:expire"], always


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
