"""How tests call the project's own commands (from the venv running pytest,
whatever PATH says) and find a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from llmfleet.paths import REPO_ROOT

VENV_BIN = Path(sys.executable).parent
LLMFLEET = [sys.executable, "-m", "llmfleet"]


def venv_tool(name: str) -> str:
    """Absolute path of a console script installed beside this interpreter."""
    return str(VENV_BIN / name)


def free_loopback_port() -> int:
    """A port nothing listens on now, on 127.0.0.1, for a server the test starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_local_playbook(tmp_path: Path, playbook: Path, *extra_vars: str) -> subprocess.CompletedProcess[str]:
    """ansible-playbook on localhost with the project's ansible.cfg, its state kept under tmp_path.

    extra_vars: each an -e value (key=value or JSON). Facts stay in memory, so
    nothing of the run outlives the test.
    """
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CACHE_PLUGIN": "memory"}
    command = [venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
               "-e", f"ansible_python_interpreter={venv_tool('python')}"]
    for value in extra_vars:
        command += ["-e", value]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=120)
