"""Failure mode 14, container up and engine dead, on a real vLLM server.

An engine container is restarted by Docker only when its main process exits
(the vllm role's restart policy), and marked unhealthy only when the role's
healthcheck command fails. Both rest on what vLLM's server does when its engine
core dies, so this test runs the real server as a GPU host runs it, with the
engine core in a process of its own, kills that process with SIGKILL (a real
crash, not an edit of the code under test), and shows the healthcheck fail and
the server exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.lab import vllm_cpu
from llmfleet.paths import REPO_ROOT
from tests.tools import free_loopback_port, wait_for

ROLE = REPO_ROOT / "roles" / "vllm"
# vLLM names its V1 engine core process this way (the kernel keeps 15 characters).
ENGINE_CORE_TITLE = "VLLM::EngineCore"


def _healthcheck_argv(port: int) -> list[str]:
    """The engine container's healthcheck, as the role writes it, aimed at this server's port."""
    service = yaml.safe_load((ROLE / "tasks" / "service.yml").read_text())
    module = "community.docker.docker_container"
    containers = [task[module] for task in service if module in task]
    test = next(container["healthcheck"]["test"] for container in containers if "healthcheck" in container)
    assert test[:2] == ["CMD", "python3"], test
    return [sys.executable, *(arg.replace("{{ __vllm_container_port }}", str(port)) for arg in test[2:])]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # the process ended while we looked
            # The parent is the second field after the parenthesised name.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _engine_core(server_pid: int) -> int | None:
    for child in _children(server_pid):
        try:
            title = (Path("/proc") / str(child) / "comm").read_text().strip()
        except OSError:
            continue
        if ENGINE_CORE_TITLE.startswith(title):
            return child
    return None


def _healthy(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0


@pytest.mark.vllm
def test_a_killed_engine_core_fails_the_healthcheck_and_the_server_exits(tiny_model: Path, tmp_path: Path) -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    # Docker restarts an exited container under these policies whatever its exit code; vLLM's
    # server exits 0 when its engine core dies, so `on-failure` would leave the engine down.
    assert defaults["vllm_restart_policy"] in ("always", "unless-stopped"), defaults["vllm_restart_policy"]
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    allowed = specs["argument_specs"]["main"]["options"]["vllm_restart_policy"]["choices"]
    assert set(allowed) <= {"always", "unless-stopped"}, allowed

    port = free_loopback_port()
    server = vllm_cpu.start_server(
        tiny_model, port=port, kv_cache_gib=1, log_path=tmp_path / "server.log", served_model_name="tiny",
        # As on a GPU host: the engine core in its own process (the lab's CPU engines keep it in one).
        extra_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        extra_args=("--enforce-eager",),  # no compile: the test is about the crash, not the speed
    )  # fmt: skip
    try:
        healthcheck = _healthcheck_argv(port)
        assert _healthy(healthcheck), "the role's healthcheck fails on a serving engine"
        core = wait_for(lambda: _engine_core(server.pid), f"the {ENGINE_CORE_TITLE} process under the server", 30)

        os.kill(core, signal.SIGKILL)

        wait_for(lambda: not _healthy(healthcheck), "the healthcheck to fail after the engine core died", 60)
        exit_code = server.process.wait(timeout=120)
        log = server.log_text()
        assert "EngineDeadError" in log, log[-3000:]
        print(f"engine core killed: healthcheck failed, server exited with {exit_code}")
    finally:
        server.stop()
