"""Every `llmfleet` command loads without the gateway's service libraries.

The CLI registers all command groups up front, so a group that imports redis,
FastAPI or uvicorn at module level breaks `llmfleet stack check` on a host that
runs it from a checkout without them (seen on a GPU host). Service imports
belong inside the commands that serve.
"""

from __future__ import annotations

import subprocess
import sys

from llmfleet.paths import REPO_ROOT

SERVICE_LIBRARIES = ("redis", "fastapi", "uvicorn", "starlette", "prometheus_client")

PROGRAM = """
import importlib.abc, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is blocked by the test")
        return None
sys.meta_path.insert(0, Block())
from llmfleet.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _llmfleet_without_services(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, ",".join(SERVICE_LIBRARIES), *args],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )


def test_help_lists_every_command_without_service_libraries() -> None:
    result = _llmfleet_without_services("--help")
    assert result.returncode == 0, result.stderr
    for command in ("stack", "gateway", "worker", "token", "engine"):
        assert command in result.stdout


def test_stack_check_runs_without_service_libraries() -> None:
    # The H200 device's real answer (driver 580.159.04, compute capability 9.0) on the mission stack.
    result = _llmfleet_without_services(
        "stack", "check", "--driver", "580.159.04", "--cuda", "12.1", "--torch", "2.3.0+cu121",
        "--vllm", "0.4.2", "--compute-capability", "9.0",
    )
    assert result.returncode == 0, result.stderr
    assert "compatible" in result.stdout
