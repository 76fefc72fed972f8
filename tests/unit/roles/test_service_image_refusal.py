"""The gateway and worker roles refuse a service image that is not one, naming the command that builds it.

A site that copies production.example and forgets the image, or leaves a
CHANGE-ME in it, must stop in the role's preflight with
`llmfleet image build service` in the message, not later in `docker load`
with a registry error. Both roles run the same service image, so both are
driven through the same cases. The preflight's first task runs for real
here, through ansible-playbook on localhost (it only reads variables:
nothing is changed on this machine).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.tools import run_local_playbook

ROLES = ["gateway", "worker"]
COMMAND = "llmfleet image build service"


def _image_check(tmp_path: Path, role: str, image: str) -> str:
    """The output of the role's image check task, from its header to the next task's."""
    task = f"{role} : preflight | Check that the service image is named"
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- name: Preflight\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        f"    - name: Run the {role} role's preflight\n"
        f"      ansible.builtin.include_role: {{name: {role}, tasks_from: preflight}}\n"
    )
    result = run_local_playbook(tmp_path, playbook, json.dumps({f"{role}_image": image}))
    output = result.stdout + result.stderr
    match = re.search(rf"TASK \[{re.escape(task)}\].*?(?=\nTASK \[|\nPLAY RECAP)", output, re.DOTALL)
    assert match, f"the {role} image check did not run:\n{output[-3000:]}"
    return match.group(0)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("image", ["llmfleet/service:CHANGE-ME", "registry.example/llmfleet/service:change_me", ""])
def test_a_placeholder_or_empty_image_is_refused_naming_the_command(tmp_path: Path, role: str, image: str) -> None:
    task = _image_check(tmp_path, role, image)
    assert "fatal: [localhost]" in task, task
    assert COMMAND in task, task
    # The message names the variable to set, the role's own.
    assert f"{role}_image is {image or 'empty'}" in task, task


@pytest.mark.parametrize("role", ROLES)
def test_a_real_reference_passes_the_check(tmp_path: Path, role: str) -> None:
    # The control: the same task on a built image's reference passes.
    task = _image_check(tmp_path, role, "llmfleet/service:0.1.0-3f9c2a1")
    assert "ok: [localhost]" in task and "fatal" not in task, task
