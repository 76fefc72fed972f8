"""How tests call the project's own commands (from the venv running pytest,
whatever PATH says), find a free loopback port and wait on a condition."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from llmfleet.paths import REPO_ROOT

VENV_BIN = Path(sys.executable).parent
LLMFLEET = [sys.executable, "-m", "llmfleet"]

T = TypeVar("T")


def load_plugin(path: Path, name: str) -> ModuleType:
    """A plugin file (a role's filter_plugins one, which no package holds) loaded as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def venv_tool(name: str) -> str:
    """Absolute path of a console script installed beside this interpreter."""
    return str(VENV_BIN / name)


def free_loopback_port() -> int:
    """A port nothing listens on now, on 127.0.0.1, for a server the test starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_local_playbook(
    tmp_path: Path, playbook: Path, *extra_vars: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook on localhost with the project's ansible.cfg, its state kept under tmp_path.

    extra_vars: each an -e value (key=value or JSON). check: run with --check. Facts
    stay in memory, so nothing of the run outlives the test.
    """
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CACHE_PLUGIN": "memory"}
    command = [venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
               "-e", f"ansible_python_interpreter={venv_tool('python')}"]
    for value in extra_vars:
        command += ["-e", value]
    if check:
        command.append("--check")
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=120)


def wait_for(condition: Callable[[], T | None], what: str, timeout_s: float = 120.0, interval_s: float = 0.1) -> T:
    """The condition's first truthy value, polled every interval_s: wait on a condition, never sleep blind."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout_s:.0f} s; last seen: {last!r}")
        time.sleep(interval_s)
