"""Run the repository's plugins the way Ansible runs them: ad-hoc on localhost.

Tests use it to call a module (`ansible localhost -m NAME`) or a filter (through
`-m debug`) with plugins/ on the search paths and none of the repository's
ansible.cfg, so Ansible itself packages each module with its module_utils.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.paths import REPO_ROOT
from tests.tools import venv_tool


def ansible_env(tmp_path: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "ANSIBLE_LIBRARY": str(REPO_ROOT / "plugins" / "modules"),
        "ANSIBLE_MODULE_UTILS": str(REPO_ROOT / "plugins" / "module_utils"),
        "ANSIBLE_FILTER_PLUGINS": str(REPO_ROOT / "plugins" / "filter"),
        "ANSIBLE_LOOKUP_PLUGINS": str(REPO_ROOT / "plugins" / "lookup"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
    }
    env.pop("ANSIBLE_CONFIG", None)
    return env


def run_adhoc(tmp_path: Path, module: str, args: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [
        venv_tool("ansible"), "localhost", "-i", "localhost,", "-c", "local",
        "-e", f"ansible_python_interpreter={sys.executable}", "-m", module, "-a", args, *flags,
    ]
    # Run outside the repository so only the settings above apply, not ansible.cfg.
    return subprocess.run(command, cwd=tmp_path, env=ansible_env(tmp_path), capture_output=True, text=True,
                          check=False)


@dataclass(frozen=True)
class ModuleRun:
    returncode: int
    result: dict[str, Any]  # the module's result, plus "failed" read from the host line
    output: str  # what Ansible printed before the result (a --diff), and stderr


def run_module(tmp_path: Path, module: str, args: dict[str, Any], check_mode: bool = False,
               diff: bool = False) -> ModuleRun:
    """Run a module on localhost and parse the "localhost | STATUS => {...}" result."""
    flags = [*(["--check"] if check_mode else []), *(["--diff"] if diff else [])]
    completed = run_adhoc(tmp_path, module, json.dumps(args), *flags)
    host_line = next((line for line in completed.stdout.splitlines() if line.startswith("localhost | ")), None)
    assert host_line is not None, f"no module result in output:\n{completed.stdout}\n{completed.stderr}"
    before, _, body = completed.stdout.partition(host_line)
    status, _, first = host_line.partition(" => ")
    result: dict[str, Any] = json.loads(first + body)
    # ansible-core 2.19's default callback reports failure on the host line only.
    result["failed"] = status.strip().endswith("FAILED!")
    assert result["failed"] == (completed.returncode != 0), completed.stdout
    return ModuleRun(completed.returncode, result, before + completed.stderr)
