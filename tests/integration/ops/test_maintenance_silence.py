"""The maintenance silences, for real: playbooks/tasks/maintenance_silence.yml against a real Alertmanager.

Debian's prometheus-alertmanager 0.25 (scripts/bootstrap.sh installs it) runs on a
free loopback port with its own configuration and storage. ansible-playbook runs the
task file as the playbooks include it (create first in a block, expire in its
always:) on a host of a small inventory written here, whose monitoring host is this
machine (connection local, Alertmanager's listen address 127.0.0.1): the request goes
from the monitoring host to Alertmanager's own address, as on a site. The host's
addresses (10.99.*) are only label values: all traffic stays on loopback.
What is checked is read back through Alertmanager's API v2.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import free_loopback_port, venv_tool, wait_for

TASKS = REPO_ROOT / "playbooks" / "tasks" / "maintenance_silence.yml"
HOST = "gpu-a"
# The host's own address (exporters) and the one its engines are published at.
ADDRESS, ENGINE_ADDRESS = "10.99.0.41", "10.99.1.41"
MAX_S = 600


@dataclass(frozen=True)
class Alertmanager:
    url: str
    port: int


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    binary = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
    assert Path(binary).is_file(), "Debian's prometheus-alertmanager is not installed: run scripts/bootstrap.sh"
    work = tmp_path_factory.mktemp("alertmanager")
    config = work / "alertmanager.yml"
    config.write_text(yaml.safe_dump({"route": {"receiver": "nobody"}, "receivers": [{"name": "nobody"}]}))
    port = free_loopback_port()
    log = (work / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert process.poll() is None, f"Alertmanager exited: {(work / 'alertmanager.log').read_text()}"
            try:
                return httpx.get(f"{url}/-/ready", timeout=2, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, "Alertmanager ready", timeout_s=30)
        yield Alertmanager(url, port)
    finally:
        process.terminate()  # the process this fixture started, by its PID
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _silences(am: Alertmanager) -> list[dict[str, Any]]:
    response = httpx.get(f"{am.url}/api/v2/silences", timeout=10, trust_env=False)
    response.raise_for_status()
    return [silence for silence in response.json() if silence["createdBy"].startswith("llmfleet ")]


def _active(am: Alertmanager) -> list[dict[str, Any]]:
    return [silence for silence in _silences(am) if silence["status"]["state"] in ("active", "pending")]


@pytest.fixture(autouse=True)
def _no_silence_left(alertmanager: Alertmanager) -> Iterator[None]:
    """Each test starts and ends with none of llmfleet's silences active."""
    yield
    for silence in _active(alertmanager):
        httpx.delete(f"{alertmanager.url}/api/v2/silence/{silence['id']}", timeout=10, trust_env=False)


def _inventory(path: Path, am_port: int | None) -> Path:
    hosts: dict[str, Any] = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "hosts": {HOST: {"llmfleet_address": ADDRESS, "vllm_publish_address": ENGINE_ADDRESS}},
            "children": {},
        }
    }
    if am_port is not None:
        hosts["all"]["children"]["monitoring"] = {
            "hosts": {"mon": {"alertmanager_listen_address": "127.0.0.1", "alertmanager_port": am_port}}
        }
    path.write_text(yaml.safe_dump(hosts))
    return path


def _include(step: str, playbook: str, **more: Any) -> dict[str, Any]:
    return {"name": f"{step} ({playbook})", "ansible.builtin.include_tasks": {"file": str(TASKS)},
            "vars": {"maintenance_silence": step, "maintenance_silence_playbook": playbook, **more}}


# As engines.yml and gpu_hosts.yml include it: create first in a block, expire in its always:.
# -e lift=false leaves the silence; -e fail_maintenance=true fails the work in between.
AROUND_WORK = [{
    "name": "Maintenance silence around the work, as the playbooks include it",
    "hosts": HOST,
    "gather_facts": False,
    "tasks": [{
        "name": "Work on the host, its alerts silenced",
        "block": [
            _include("create", "engines.yml"),
            {"name": "The work fails when asked", "ansible.builtin.fail": {"msg": "the maintenance failed"},
             "when": "fail_maintenance | default(false) | bool"},
        ],
        "always": [_include("expire", "engines.yml") | {"when": "lift | default(true) | bool"}],
    }],
}]

# As scale_out.yml runs engines.yml: the outer playbook's silence is kept by the inner one's
# create and expire, and lifted by the outer's; -e inner_fails=true: the inner one's rescue
# lifts it, whoever made it (the host stops there).
NESTED = [{
    "name": "A playbook's silence around another's",
    "hosts": HOST,
    "gather_facts": False,
    "tasks": [
        _include("create", "scale_out.yml"),
        {"name": "The inner playbook", "block": [
            _include("create", "engines.yml"),
            {"name": "The inner work fails when asked", "ansible.builtin.fail": {"msg": "inner failed"},
             "when": "inner_fails | default(false) | bool"},
        ], "rescue": [
            _include("expire", "engines.yml", maintenance_silence_force=True),
            {"name": "Fail the host", "ansible.builtin.fail": {"msg": "inner failed"}},
        ], "always": [_include("expire", "engines.yml")]},
        {"name": "Record the silence after the inner playbook",
         "ansible.builtin.copy": {"content": "{{ __maintenance_silence_state | to_json }}", "dest": "{{ record }}",
                                  "mode": "0644"}},
        _include("expire", "scale_out.yml"),
    ],
}]


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str

    @property
    def unwrapped(self) -> str:
        # The YAML callback folds long lines, and doubles the quote in a single-quoted string.
        return " ".join(self.output.split()).replace("''", "'")


def _run(tmp_path: Path, inventory: Path, plays: list[dict[str, Any]], *extra: str) -> Run:
    playbook = tmp_path / "maintenance.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp_path / "home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CACHE_PLUGIN": "memory"}
    result = subprocess.run(
        [venv_tool("ansible-playbook"), "-i", str(inventory), str(playbook),
         "-e", f"llmfleet_maintenance_silence_max_s={MAX_S}", *extra],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=180,
    )
    return Run(result.returncode, result.stdout + result.stderr)


def _time(value: str) -> datetime:
    return datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S")


def test_a_silence_covers_the_host_s_alerts_until_the_work_is_done(alertmanager: Alertmanager, tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", alertmanager.port)
    before = {silence["id"] for silence in _silences(alertmanager)}
    run = _run(tmp_path, inventory, AROUND_WORK, "-e", "lift=false")
    assert run.returncode == 0, run.output[-5000:]
    active = _active(alertmanager)
    assert len(active) == 2, active  # one on `instance`, one on `host`
    by_label = {silence["matchers"][0]["name"]: silence for silence in active}
    assert set(by_label) == {"instance", "host"}, active
    for silence in active:
        assert len(silence["matchers"]) == 1 and silence["matchers"][0]["isRegex"], silence
        assert silence["createdBy"] == "llmfleet engines.yml"
        assert "engines.yml" in silence["comment"] and HOST in silence["comment"], silence["comment"]
        length = (_time(silence["endsAt"]) - _time(silence["startsAt"])).total_seconds()
        assert MAX_S - 120 < length <= MAX_S + 1, length
    instance = by_label["instance"]["matchers"][0]["value"]
    # Every target of the host (exporters on its address, engines on theirs), nothing of any other host.
    for label in (f"{ADDRESS}:9100", f"{ADDRESS}:9400", f"{ENGINE_ADDRESS}:8000", f"{ENGINE_ADDRESS}:8001"):
        assert re.fullmatch(instance, label), (instance, label)
    for label in ("10.99.0.42:9100", "10.99.0.4:9100", "110.99.0.41:9100", "10.99.0.41"):
        assert not re.fullmatch(instance, label), (instance, label)
    host = by_label["host"]["matchers"][0]["value"]
    assert re.fullmatch(host, ADDRESS) and re.fullmatch(host, ENGINE_ADDRESS) and not re.fullmatch(host, "10.99.0.4")
    assert "Silenced gpu-a's alerts in Alertmanager for engines.yml" in run.unwrapped

    # A second run renews the same silences instead of stacking new ones...
    again = _run(tmp_path, inventory, AROUND_WORK, "-e", "lift=false")
    assert again.returncode == 0, again.output[-5000:]
    assert {silence["id"] for silence in _active(alertmanager)} == {silence["id"] for silence in active}
    # ... and once the work is done, the run expires exactly what it holds: nothing stays active.
    done = _run(tmp_path, inventory, AROUND_WORK)
    assert done.returncode == 0, done.output[-5000:]
    assert _active(alertmanager) == []
    made = {silence["id"]: silence for silence in _silences(alertmanager) if silence["id"] not in before}
    assert set(made) == {silence["id"] for silence in active}, "a run stacked silences"
    assert all(silence["status"]["state"] == "expired" for silence in made.values())


def test_a_failed_maintenance_lifts_its_silence_in_always(alertmanager: Alertmanager, tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", alertmanager.port)
    before = {silence["id"] for silence in _silences(alertmanager)}
    run = _run(tmp_path, inventory, AROUND_WORK, "-e", "fail_maintenance=true")
    assert run.returncode != 0 and "the maintenance failed" in run.output, run.output[-5000:]
    made = [silence for silence in _silences(alertmanager) if silence["id"] not in before]
    assert len(made) == 2, made
    assert all(silence["status"]["state"] == "expired" for silence in made), made


def test_an_enclosing_playbook_s_silence_is_kept_by_the_inner_one(alertmanager: Alertmanager, tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", alertmanager.port)
    record = tmp_path / "state.json"
    run = _run(tmp_path, inventory, NESTED, "-e", f"record={record}")
    assert run.returncode == 0, run.output[-5000:]
    # After the inner playbook's create and expire, the outer one's silence was still held...
    held = yaml.safe_load(record.read_text())
    assert held["playbook"] == "scale_out.yml" and len(held["ids"]) == 2, held
    assert "already silenced by scale_out.yml in this run: kept" in run.unwrapped
    silences = {silence["id"]: silence for silence in _silences(alertmanager)}
    assert {silences[ident]["createdBy"] for ident in held["ids"]} == {"llmfleet scale_out.yml"}
    # ... and the outer one lifted it.
    assert all(silences[ident]["status"]["state"] == "expired" for ident in held["ids"])
    assert _active(alertmanager) == []

    # The inner one failing lifts the outer one's silence: that run stops for the host.
    failing = _run(tmp_path, inventory, NESTED, "-e", f"record={record}", "-e", "inner_fails=true")
    assert failing.returncode != 0 and "inner failed" in failing.output, failing.output[-5000:]
    assert _active(alertmanager) == []


def test_check_mode_creates_nothing(alertmanager: Alertmanager, tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", alertmanager.port)
    before = sorted(_silences(alertmanager), key=lambda silence: silence["id"])
    run = _run(tmp_path, inventory, AROUND_WORK, "--check", "-e", "lift=false")
    assert run.returncode == 0, run.output[-5000:]
    assert sorted(_silences(alertmanager), key=lambda silence: silence["id"]) == before
    assert "Check mode: engines.yml would silence gpu-a's alerts" in run.unwrapped, run.output[-3000:]


def test_alertmanager_down_warns_and_the_maintenance_goes_on(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", free_loopback_port())  # nothing listens there
    run = _run(tmp_path, inventory, AROUND_WORK)
    assert run.returncode == 0, run.output[-5000:]
    assert "WARNING: gpu-a's alerts are NOT silenced during engines.yml" in run.unwrapped, run.output[-3000:]
    assert "did not answer" in run.unwrapped


def test_no_monitoring_host_skips_with_a_line_saying_so(tmp_path: Path) -> None:
    run = _run(tmp_path, _inventory(tmp_path / "hosts.yml", None), AROUND_WORK)
    assert run.returncode == 0, run.output[-5000:]
    assert "the inventory has no host in group 'monitoring'" in run.unwrapped, run.output[-3000:]
