"""Helpers for the whole-stack lab scenario.

The tests run their own copy of the lab inventory under another lab name and
subnet, so an operator's running lab (`scripts/lab.sh`) is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llmfleet.paths import REPO_ROOT
from tests.tools import LLMFLEET, venv_tool

TEST_LAB_NAME = "llmfleet-labtest"
RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class PlaybookRun:
    returncode: int
    output: str

    @property
    def recap(self) -> dict[str, dict[str, int]]:
        return {
            m["host"]: {key: int(m[key]) for key in ("ok", "changed", "unreachable", "failed")}
            for m in RECAP_LINE.finditer(self.output)
        }


def copy_lab_inventory(destination: Path) -> Path:
    """The lab inventory, renamed to the test lab and moved to its own subnet."""
    shutil.copytree(REPO_ROOT / "inventories" / "lab", destination)
    hosts = destination / "hosts.yml"
    text = hosts.read_text().replace("lab_name: llmfleet-lab", f"lab_name: {TEST_LAB_NAME}")
    hosts.write_text(text.replace("10.77.0.", "10.78.0."))
    return destination


def run_playbook(inventory: Path, playbook: str, *extra: str, facts: Path) -> PlaybookRun:
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts), "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run(
        [venv_tool("ansible-playbook"), "-i", str(inventory), str(REPO_ROOT / "playbooks" / playbook), *extra],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
    )
    return PlaybookRun(result.returncode, result.stdout + result.stderr)


def llmfleet_lab(inventory: Path, action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LLMFLEET, "lab", "--inventory", str(inventory / "hosts.yml"), action],
        capture_output=True, text=True, check=False,
    )
