"""Failure mode 4: an engine bound to 127.0.0.1 fails the vllm role's post-deploy reachability check.

The session's real vLLM-CPU server listens on 127.0.0.1 only, as an engine
started with `--host 127.0.0.1` would. The role's own verify tasks
(roles/vllm/tasks/verify.yml, run as written through ansible-playbook on
localhost) reach it at 127.0.0.1 and pass; published at another address of the
same host, 127.0.0.2 (a second loopback address standing for the host's
inventory address), the server refuses the connection, and the check from the
client host fails, naming the pair. No fault is injected: the bind is real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.lab import vllm_cpu
from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

pytestmark = pytest.mark.vllm

VERIFY = yaml.safe_load((REPO_ROOT / "roles" / "vllm" / "tasks" / "verify.yml").read_text())
REACH = "verify | Check every client host reaches every engine"


def _verify(tmp_path: Path, server: vllm_cpu.VllmServer, address: str, tasks: list[dict[str, Any]]) -> tuple[int, str]:
    port = int(server.url.rsplit(":", 1)[1])
    variables = {
        "vllm_publish_address": address,
        "vllm_client_hosts": ["localhost"],
        "vllm_ready_timeout": 10,
        # The role's default: the session's engine takes no API key.
        "vllm_api_key": "",
        "__vllm_plan": [{"name": "tiny", "port": port, "served_model_name": "tiny"}],
    }
    playbook = tmp_path / "verify.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    result = run_local_playbook(tmp_path, playbook, json.dumps(variables))
    return result.returncode, result.stdout + result.stderr


def test_the_verify_step_passes_an_engine_reached_at_its_bind(
    vllm_server: vllm_cpu.VllmServer, tmp_path: Path
) -> None:
    code, output = _verify(tmp_path, vllm_server, "127.0.0.1", VERIFY)
    assert code == 0, output[-3000:]
    assert "localhost -> tiny" in output


def test_an_engine_bound_to_127_0_0_1_fails_the_check_from_its_client(
    vllm_server: vllm_cpu.VllmServer, tmp_path: Path
) -> None:
    reach = [task for task in VERIFY if task["name"] == REACH]
    assert len(reach) == 1
    code, output = _verify(tmp_path, vllm_server, "127.0.0.2", reach)
    assert code != 0
    failed = [line for line in output.splitlines() if line.startswith("failed: [localhost")]
    assert failed and "(item=localhost -> tiny)" in failed[0], output[-3000:]
    assert "Connection refused" in output
    # The server itself still answers at its bind: the fault is where it listens, not that it is down.
    assert vllm_server.process.poll() is None
