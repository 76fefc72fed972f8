"""Helpers for the whole-stack lab scenario.

The tests run their own copy of the lab inventory under another lab name and
subnet, so an operator's running lab (`scripts/lab.sh`) is left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from llmfleet.bench.provisioning import RECAP_LINE
from llmfleet.paths import REPO_ROOT
from tests import tools
from tests.tools import LLMFLEET, venv_tool

T = TypeVar("T")

TEST_LAB_NAME = "llmfleet-labtest"
# The test lab's site runs prepare its three GPU hosts in one batch, not one at a time (gpu_hosts_serial, default
# 1): the same roles and drains run either way, the batch only saves CI about a third of each run. One host at a
# time under traffic is what test_rolling_restart_under_traffic_cuts_no_request proves, through engines.yml.
# The engines stay one host at a time (engines_serial): in one batch the two hosts' 3.8 GB engine-image archives
# were copied and loaded side by side, and both loads failed ("Detected no loaded images") in the fresh-clone run.
SITE_IN_ONE_BATCH = ("-e", "gpu_hosts_serial=100%")
# Each playbook run's whole output, with every task's duration (profile_tasks),
# so a slow or failed run can be read after the test, in CI too.
PLAYBOOK_LOGS = REPO_ROOT / "out" / "test-logs" / "lab-playbooks"
# Seconds of the lab's own steps, for the provisioning report (test_second_run_changes_nothing).
LAB_TIMINGS: dict[str, float] = {}
# The build machine on the test lab's network (lab_controller_address, moved to 10.78.0.0/24): the lab's scaler
# and the alert sink listen there.
LAB_CONTROLLER = "10.78.0.1"
ALERT_SINK_PORT = 9096
# Prometheus on mon1 in the test lab (inventories/lab/group_vars/monitoring/lab.yml, moved to 10.78.0.0/24).
PROMETHEUS = "http://10.78.0.30:9090"


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
    # Alertmanager's chat and Watchdog notifications go to the test's alert sink (tests/lab/alert_sink.py).
    (destination / "group_vars" / "monitoring" / "alert_sink.yml").write_text(
        "---\n"
        f"alertmanager_slack_api_url: http://{LAB_CONTROLLER}:{ALERT_SINK_PORT}/chat\n"
        f"alertmanager_watchdog_url: http://{LAB_CONTROLLER}:{ALERT_SINK_PORT}/watchdog\n"
        "alertmanager_allow_no_receiver: false\n"
    )
    return destination


def run_playbook(inventory: Path, playbook: str, *extra: str, facts: Path, log_as: str | None = None) -> PlaybookRun:
    """Run a playbook against the test lab; its output is kept under PLAYBOOK_LOGS, named after log_as (the
    calling test's name by default: give one when the run happens in another thread)."""
    env = {
        **os.environ,
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
    }
    result = subprocess.run(
        [venv_tool("ansible-playbook"), "-i", str(inventory), str(REPO_ROOT / "playbooks" / playbook), *extra],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
    )
    run = PlaybookRun(result.returncode, result.stdout + result.stderr)
    _keep_log(playbook, run, log_as)
    return run


def _keep_log(playbook: str, run: PlaybookRun, log_as: str | None) -> None:
    # PYTEST_CURRENT_TEST is "tests/lab/test_site.py::test_name (call)".
    test = log_as or os.environ.get("PYTEST_CURRENT_TEST", "outside-a-test").split("::")[-1].split()[0]
    PLAYBOOK_LOGS.mkdir(parents=True, exist_ok=True)
    (PLAYBOOK_LOGS / f"{test}.{Path(playbook).stem}.log").write_text(run.output)


def on_host(host: str, *command: str) -> str:
    """Run a command in a test lab host (the engines run in each host's own Docker engine); its stdout and stderr."""
    result = subprocess.run(["docker", "exec", f"{TEST_LAB_NAME}-{host}", *command],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, (host, command, result.stderr)
    return result.stdout + result.stderr


def mint_token(tmp_path: Path, *claims: str) -> str:
    """A token from `llmfleet token` (10 minutes unless claims say otherwise), signed with the gateway host's key."""
    secret = tmp_path / "jwt_secret"
    secret.touch(mode=0o600)
    secret.write_text(on_host("gw1", "cat", "/etc/llmfleet/gateway/jwt_secret"))
    minted = subprocess.run([*LLMFLEET, "token", "--sub", "lab-test", "--models", "tiny", "--ttl", "10m", *claims,
                             "--secret-file", str(secret)], capture_output=True, text=True, check=False)
    secret.unlink()
    assert minted.returncode == 0, minted.stderr
    return minted.stdout.strip()


def llmfleet_lab(inventory: Path, action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LLMFLEET, "lab", "--inventory", str(inventory / "hosts.yml"), action],
        capture_output=True, text=True, check=False,
    )


def wait_for(condition: Callable[[], T | None], what: str, timeout_s: float = 120.0) -> T:
    """The condition's first truthy value; Prometheus scrapes every few seconds, so poll once a second."""
    return tools.wait_for(condition, what, timeout_s, interval_s=1.0)


def prometheus(path: str, **params: str) -> Any:
    response = httpx.get(f"{PROMETHEUS}/api/v1/{path}", params=params, timeout=10)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]
