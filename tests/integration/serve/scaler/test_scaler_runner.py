"""The runner path for real: the scaler's app runs ansible-runner, not dry, on TEST playbooks (connection local).

The project directory here is a test one: its playbooks/scale_out.yml and
scale_in.yml are TEST playbooks that only write what they were given (the
real ones need the lab's hosts). Everything else is real: uvicorn, the policy,
ansible-inventory with the llmfleet_scaler plugin reading the state file,
ansible-runner running ansible-playbook against localhost, and its artifacts.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from llmfleet.paths import REPO_ROOT
from llmfleet.serve.scaler.app import create_app
from llmfleet.serve.scaler.audit import read
from llmfleet.serve.scaler.config import ScalerSettings
from llmfleet.serve.scaler.state import load
from tests.scaler_tools import alert, notification
from tests.tools import free_loopback_port, wait_for

# TEST playbook, not the real scale_out.yml: records the variables the scaler
# passed and the worker_count the inventory plugin applied from the state file.
TEST_SCALE_OUT = """\
- name: TEST playbook standing in for playbooks/scale_out.yml
  hosts: gateways
  gather_facts: false
  tags: [always]  # the scaler runs with --tags worker; the real playbooks' own plays are tagged always too
  tasks:
    - name: Write what the scaler asked for
      ansible.builtin.copy:
        dest: "{{ scaler_test_output }}"
        content: >-
          {{ {'scale_kind': scale_kind, 'scale_worker_counts': scale_worker_counts,
              'worker_count_from_plugin': worker_count, 'limit': ansible_limit, 'action': scale_action_id} | to_json }}
        mode: "0600"
"""

# TEST playbook standing in for playbooks/scale_in.yml: it fails, as a broken run would.
TEST_SCALE_IN_FAILS = """\
- name: TEST playbook standing in for playbooks/scale_in.yml, failing
  hosts: gateways
  gather_facts: false
  tags: [always]  # the scaler runs with --tags worker; the real playbooks' own plays are tagged always too
  tasks:
    - name: Fail as a broken scale-in would
      ansible.builtin.fail:
        msg: TEST failure
"""


# TEST playbook standing in for a scale-out that hangs (a host that never answers): it outlives the timeout. The
# cancel ends ansible-playbook; the module's own process (here a local `sleep`) is not its child any more and runs
# to its end, so it is kept short.
TEST_SCALE_OUT_HANGS = """\
- name: TEST playbook standing in for playbooks/scale_out.yml, hanging
  hosts: gateways
  gather_facts: false
  tags: [always]
  tasks:
    - name: Hang as a task on an unreachable host would
      ansible.builtin.command: sleep 40
      changed_when: false
"""


def make_project(tmp_path: Path, scale_out: str) -> Path:
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "playbooks" / "scale_out.yml").write_text(scale_out)
    (project / "playbooks" / "scale_in.yml").write_text(TEST_SCALE_IN_FAILS)
    (project / "ansible.cfg").write_text(
        f"[defaults]\ninventory_plugins = {REPO_ROOT / 'plugins' / 'inventory'}\nretry_files_enabled = false\n"
        "[inventory]\nany_unparsed_is_failed = true\n"
    )
    (tmp_path / "inventory" / "hosts.yml").write_text(
        json.dumps(
            {
                "all": {
                    "vars": {"scaler_test_output": str(tmp_path / "ran.json")},
                    "children": {
                        "gateways": {
                            "hosts": {
                                "gw-local": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": sys.executable,
                                    "worker_count": 1,
                                }
                            }
                        },
                        "gpu_nodes": {"hosts": {}},
                        "gpu_standby": {"hosts": {}},
                    },
                }
            }
        )
    )
    return project


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, TEST_SCALE_OUT)


@pytest.fixture
def client(
    make_settings: Callable[..., ScalerSettings], project: Path
) -> Iterator[tuple[httpx.Client, ScalerSettings]]:
    with serving(make_settings, project) as served:
        yield served


@contextmanager
def serving(
    make_settings: Callable[..., ScalerSettings], project: Path, **env: str
) -> Iterator[tuple[httpx.Client, ScalerSettings]]:
    settings = make_settings(
        LLMFLEET_SCALER_PORT=str(free_loopback_port()),
        LLMFLEET_SCALER_PROJECT_DIR=str(project),
        LLMFLEET_SCALER_WORKERS__MIN="1",
        LLMFLEET_SCALER_WORKERS__MAX="4",
        LLMFLEET_SCALER_WORKERS__COOLDOWN_IN_S="0",
        LLMFLEET_SCALER_WORKERS__COOLDOWN_OUT_S="0",
        **env,
    )
    app = create_app(settings)  # the real AnsibleRunner and ansible-inventory
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "uvicorn to start", timeout_s=240)
    token = settings.token_file.read_text().strip()
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{settings.port}", headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as http:
            yield http, settings
    finally:
        server.should_exit = True
        thread.join(60)


def test_a_taken_decision_runs_ansible_runner_and_keeps_its_artifacts(
    client: tuple[httpx.Client, ScalerSettings], tmp_path: Path
) -> None:
    http, settings = client
    state_file = settings.state_dir / "state.json"
    response = http.post("/alerts", json=notification(alert("ScaleOutNeeded", "workers", "out")))
    assert response.status_code == 200
    decision = response.json()["decisions"][0]
    assert (decision["outcome"], decision["action"]["worker_counts"]) == ("taken", {"gw-local": 2})
    wait_for(lambda: load(state_file).in_flight is None, "the playbook run to end", timeout_s=240)

    ran = json.loads((tmp_path / "ran.json").read_text())
    assert ran == {
        "scale_kind": "workers",
        "scale_worker_counts": {"gw-local": 2},
        # The inventory plugin applied the in-flight count from the state file to the run's inventory.
        "worker_count_from_plugin": 2,
        "limit": "gateways:monitoring",
        "action": decision["action"]["id"],
    }
    assert load(state_file).worker_counts == {"gw-local": 2}
    end = next(r for r in read(settings.state_dir / "audit.jsonl") if r["event"] == "action_end")
    assert (end["result"], end["rc"]) == ("successful", 0)
    artifacts = Path(end["artifacts"])
    assert artifacts == settings.state_dir / "runner" / "artifacts" / decision["action"]["id"]
    assert (artifacts / "rc").read_text().strip() == "0"
    assert "Write what the scaler asked for" in (artifacts / "stdout").read_text()

    # A failing playbook: the action ends failed, membership stays as it was.
    response = http.post("/alerts", json=notification(alert("ScaleInPossible", "workers", "in", fingerprint="in1")))
    assert response.json()["decisions"][0]["outcome"] == "taken"
    wait_for(lambda: load(state_file).in_flight is None, "the failing run to end", timeout_s=240)
    ends = [r for r in read(settings.state_dir / "audit.jsonl") if r["event"] == "action_end"]
    assert [(e["result"], e["rc"]) for e in ends] == [("successful", 0), ("failed", 2)]
    assert load(state_file).worker_counts == {"gw-local": 2}
    metrics = http.get("/metrics").text
    assert 'llmfleet_scaler_actions_total{direction="in",kind="workers",result="failed"} 1.0' in metrics
    assert 'llmfleet_scaler_worker_count{host="gw-local"} 2.0' in metrics


def test_a_run_past_its_timeout_is_cancelled_and_counts_as_a_failure(
    make_settings: Callable[..., ScalerSettings], tmp_path: Path
) -> None:
    project = make_project(tmp_path, TEST_SCALE_OUT_HANGS)
    with serving(make_settings, project, LLMFLEET_SCALER_PLAYBOOK_TIMEOUT_S="5") as (http, settings):
        state_file = settings.state_dir / "state.json"
        response = http.post("/alerts", json=notification(alert("ScaleOutNeeded", "workers", "out")))
        assert response.json()["decisions"][0]["outcome"] == "taken"
        # While it runs, the start of the run is exported (ScalerStuck compares it with the timeout).
        started = float(metric_line(http, "llmfleet_scaler_action_started_timestamp_seconds "))
        assert started > 0
        assert metric_line(http, "llmfleet_scaler_playbook_timeout_seconds ") == "5.0"
        wait_for(lambda: load(state_file).in_flight is None, "the hanging run to be cancelled", timeout_s=120)
        end = next(r for r in read(settings.state_dir / "audit.jsonl") if r["event"] == "action_end")
        # Cancelled at the timeout, long before the task's 40 s.
        assert end["result"] == "timeout" and end["duration_s"] < 30, end
        state = load(state_file)
        assert state.worker_counts == {} and state.failures["workers/out"].count == 1
        assert metric_line(http, "llmfleet_scaler_action_started_timestamp_seconds ") == "0.0"
        assert metric_line(http, 'llmfleet_scaler_actions_total{direction="out",kind="workers",result="timeout"}') == (
            "1.0"
        )
        assert metric_line(http, 'llmfleet_scaler_consecutive_failures{direction="out",kind="workers"}') == "1.0"


def metric_line(http: httpx.Client, start: str) -> str:
    line = next(line for line in http.get("/metrics").text.splitlines() if line.startswith(start))
    return line.rsplit(" ", 1)[1]
