"""python_toolchain stops when its packages have no source, saying which two settings are missing.

The stack's torch is a CUDA build (torch==2.3.0+cu121 for mission-cu121) that
no default index serves, and production.example ships both sources empty on
purpose: a site's first run must stop in the role's preflight naming
python_toolchain_wheelhouse and python_toolchain_index_url, the wheel label
and the command that builds a wheelhouse. The lab always sets a wheelhouse,
so it never reaches this. The check runs here as written in
tasks/preflight.yml, with the role's internal values and the version table,
through ansible-playbook on localhost (it only reads variables).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "python_toolchain"
CHECK = "preflight | Check that the packages have a source"


def _check(tmp_path: Path, wheelhouse: str, index_url: str) -> subprocess.CompletedProcess[str]:
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    task = next(task for task in tasks if task["name"] == CHECK)
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    play = [{
        "name": "Toolchain source", "hosts": "all", "gather_facts": False,
        "vars_files": [str(REPO_ROOT / "playbooks" / "vars" / "stacks.yml"), str(ROLE / "vars" / "main.yml")],
        "vars": {"gpu_stack": "mission-cu121",
                 "python_toolchain_requirements": defaults["python_toolchain_requirements"],
                 "python_toolchain_wheelhouse": wheelhouse, "python_toolchain_index_url": index_url},
        "tasks": [task],
    }]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    return run_local_playbook(tmp_path, playbook)


def test_without_a_source_the_check_names_both_settings_the_label_and_the_command(tmp_path: Path) -> None:
    result = _check(tmp_path, "", "")
    message = re.sub(r"\s+", " ", result.stdout + result.stderr)
    assert result.returncode != 0, message
    assert "torch==2.3.0+cu121" in message, message
    assert "python_toolchain_wheelhouse and python_toolchain_index_url are empty" in message, message
    assert "the stack's cu121 builds of torch" in message, message
    assert "llmfleet wheelhouse toolchain --lock LOCK DIR" in message, message


@pytest.mark.parametrize(
    ("wheelhouse", "index_url"), [("/srv/wheelhouse", ""), ("", "https://pypi-mirror.site.internal/whl/cu121")]
)
def test_either_source_passes(tmp_path: Path, wheelhouse: str, index_url: str) -> None:
    result = _check(tmp_path, wheelhouse, index_url)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "ok: [localhost]" in output, output[-3000:]
