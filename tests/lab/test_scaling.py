"""Alert-driven scaling in the whole-stack lab, end to end with real parts.

Load through the gateway backs the queue up while the engines are busy:
Prometheus on mon1 fires ScaleOutNeeded (scale_kind engines), Alertmanager
posts it to the scaler, and the scaler runs playbooks/scale_out.yml through
ansible-runner: gpu3, the standby host, gets an engine, the workers learn of it,
Prometheus scrapes it, and it serves. When the load stops, ScaleInPossible
follows: the scaler drains gpu3's engine and removes it (scale_in.yml). Every
request the gateway accepted is answered.

The scaler runs on the build machine (the lab's lab_controller_address), not on
mon1: it reaches the hosts through this machine's Docker engine, as every lab
playbook does. The alert thresholds are the lab's
(inventories/lab/group_vars/monitoring/lab.yml). The workers' count is held
(min = max = 2): this scenario scales engine hosts, and the worker-bound
decision is proven by promtool (tests/unit/roles/promtool/scaling.yml) and the
scaler's own tests.

conftest.py runs this file after test_site.py's tests and before the teardown:
it changes the site, then puts it back as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.lab.helpers import PLAYBOOK_LOGS, PlaybookRun, mint_token, on_host, prometheus, wait_for
from tests.tools import LLMFLEET

SCALER_ADDRESS, SCALER_PORT = "10.78.0.1", 9095  # lab_controller_address in the test lab
SCALER = f"http://{SCALER_ADDRESS}:{SCALER_PORT}"
SCALER_LOGS = PLAYBOOK_LOGS.parent / "lab-scaler"  # kept after the run: audit, runner artifacts, the scaler's log
GATEWAY = "http://10.78.0.10:8080"
STANDBY_HOST, STANDBY_ENGINE = "gpu3", "10.78.0.43:8000"
BASE_ENGINES = {"10.78.0.41:8000", "10.78.0.41:8001", "10.78.0.42:8000"}
REQUEST = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 32, "ignore_eos": True}
# Enough clients to keep the queue over the lab's threshold (4) while every engine runs requests; fewer while
# the scale-out runs, so the new engine gets traffic without starving the playbook of the machine's two cores.
HEAVY_CLIENTS, LIGHT_CLIENTS = 16, 3


@dataclass
class Timeline:
    """Seconds since the epoch of each step, for the printed split and for the scale-in test."""

    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks.setdefault(name, time.time() if at is None else at)


TIMELINE = Timeline()


class Load:
    """Clients posting completions through the gateway until stopped.

    Each request carries an Idempotency-Key, and a broken connection is retried
    with the same key, as a client library's retry would be: a retry is
    answered from the first run, never run twice. The final status of every
    request is counted.
    """

    def __init__(self, token: str, clients: int) -> None:
        self.outcomes: Counter[int | str] = Counter()
        self.retried_connections = 0
        self._headers = {"Authorization": f"Bearer {token}"}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(300)
        assert not any(thread.is_alive() for thread in self._threads), "a client still waits for its answer"

    def _client(self) -> None:
        with httpx.Client(timeout=300, headers=self._headers) as http:
            while not self._stop.is_set():
                status = self._request(http, uuid.uuid4().hex)
                with self._lock:
                    self.outcomes[status] += 1
                if status != 200:
                    self._stop.wait(0.2)  # counted; no tight loop against a refusing gateway

    def _request(self, http: httpx.Client, key: str) -> int | str:
        failure = "never sent"
        for _ in range(5):
            try:
                response = http.post(f"{GATEWAY}/v1/completions", json=REQUEST, headers={"Idempotency-Key": key})
            except httpx.TransportError as error:
                failure = type(error).__name__
                with self._lock:
                    self.retried_connections += 1
                continue
            return response.status_code
        return failure


def _audit() -> list[dict[str, Any]]:
    path = SCALER_LOGS / "state" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _taken(direction: str) -> dict[str, Any] | None:
    return next((record for record in _audit() if record["event"] == "decision" and record["outcome"] == "taken"
                 and record["kind"] == "engines" and record["direction"] == direction), None)


def _action_end(action_id: str) -> dict[str, Any] | None:
    return next((record for record in _audit()
                 if record["event"] == "action_end" and record.get("action_id") == action_id), None)


def _report(text: str) -> None:
    """Print a timing (scripts/test.sh shows a passed test's output, -rP) and keep it beside the audit log."""
    print(text)
    with (SCALER_LOGS / "timings.txt").open("a") as timings:
        timings.write(text + "\n")


def _run_output(end: dict[str, Any]) -> str:
    """The end of a scaler run's Ansible output (ansible-runner's artifacts), for a failure's message."""
    stdout = Path(end["artifacts"] or "/nonexistent") / "stdout"
    return f"{end}\n{stdout.read_text()[-5000:] if stdout.exists() else '(no output kept)'}"


def _served_by(engine: str) -> float:
    text = httpx.get(f"http://{engine}/metrics", timeout=10).text
    return sum(float(value) for value in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def _scraped_engines() -> set[str]:
    active = prometheus("targets", state="active")["activeTargets"]
    return {target["labels"]["instance"] for target in active if target["labels"]["job"] == "vllm"}


def _intake_rate() -> float:
    """Prompt tokens a second over the last minute; no series yet means no request since the gateways started."""
    result = prometheus("query", query="sum(rate(llmfleet_gateway_prompt_tokens_sum[1m]))")["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _note_pending_scale_out() -> None:
    """When Prometheus first found ScaleOutNeeded's condition true (the alert's activeAt, before `for:`)."""
    for alert in prometheus("alerts")["alerts"]:
        if alert["labels"]["alertname"] == "ScaleOutNeeded" and alert["labels"].get("scale_kind") == "engines":
            TIMELINE.mark("condition true", _seconds(alert["activeAt"]))


def _check_running(scaler: subprocess.Popen[bytes]) -> None:
    if scaler.poll() is not None:
        raise AssertionError(f"the scaler exited: {(SCALER_LOGS / 'scaler.log').read_text()[-3000:]}")


def _scale_out_taken(scaler: subprocess.Popen[bytes]) -> dict[str, Any] | None:
    _check_running(scaler)
    _note_pending_scale_out()
    return _taken("out")


def _scale_in_taken(scaler: subprocess.Popen[bytes]) -> dict[str, Any] | None:
    _check_running(scaler)
    return _taken("in")


def _seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module", autouse=True)
def converged(converged_site: PlaybookRun) -> None:
    assert converged_site.returncode == 0, converged_site.output[-5000:]


@pytest.fixture(scope="module")
def scaler(
    lab_inventory: Path, facts_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    """`llmfleet scaler serve` on the build machine, configured for the test lab, until the module ends."""
    shutil.rmtree(SCALER_LOGS, ignore_errors=True)
    (SCALER_LOGS / "state").mkdir(parents=True)
    secrets = yaml.safe_load((lab_inventory / "group_vars" / "all" / "lab_secrets.yml").read_text())
    token_file = tmp_path_factory.mktemp("scaler") / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(secrets["alertmanager_scaler_token"])
    settings = {
        "TOKEN_FILE": str(token_file), "PROJECT_DIR": str(REPO_ROOT), "INVENTORY": json.dumps([str(lab_inventory)]),
        "HOST": SCALER_ADDRESS, "PORT": str(SCALER_PORT), "STATE_DIR": str(SCALER_LOGS / "state"),
        # gpu1 and gpu2 serve; gpu3 is the one standby host. A scale-in may follow the scale-out after 20 s
        # (a site's default is 30 min).
        "ENGINES__MIN": "2", "ENGINES__MAX": "3", "ENGINES__COOLDOWN_OUT_S": "60", "ENGINES__COOLDOWN_IN_S": "20",
        "WORKERS__MIN": "2", "WORKERS__MAX": "2",
    }
    # The test lab's own fact cache, as run_playbook's: the operator's lab has hosts of the same names.
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts_dir),
           **{f"LLMFLEET_SCALER_{name}": value for name, value in settings.items()}}
    with (SCALER_LOGS / "scaler.log").open("wb") as log:
        process = subprocess.Popen([*LLMFLEET, "scaler", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or _healthy(), "the scaler to answer /healthz", timeout_s=60)
        assert process.poll() is None, (SCALER_LOGS / "scaler.log").read_text()
        yield process
    finally:
        process.terminate()
        process.wait(120)


def _healthy() -> bool:
    try:
        return httpx.get(f"{SCALER}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_load_adds_the_standby_host_whose_engine_then_serves(
    scaler: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    assert _scraped_engines() == BASE_ENGINES
    # ScaleOutNeeded asks for growing intake (this minute against the one before): start from a quiet minute.
    wait_for(lambda: _intake_rate() == 0, "a minute without requests", timeout_s=180)
    token = mint_token(tmp_path, "--tier", "bench", "--ttl", "1h")
    TIMELINE.mark("load started")
    heavy, light = Load(token, HEAVY_CLIENTS), Load(token, LIGHT_CLIENTS)
    try:
        decision = wait_for(partial(_scale_out_taken, scaler), "the scaler to take a scale-out",
                            timeout_s=300)
        heavy.stop()
        TIMELINE.mark("scaler took the alert", decision["time"])
        action = decision["action"]
        assert action["host"] == STANDBY_HOST, decision
        alert = decision["alerts"][0]
        assert alert["name"] == "ScaleOutNeeded", decision
        TIMELINE.mark("alert fired", _seconds(alert["starts_at"]))
        end = wait_for(partial(_action_end, action["id"]), "the scale-out playbook to end", timeout_s=900)
        TIMELINE.mark("scale-out ended", end["time"])
        assert end["result"] == "successful", _run_output(end)
        wait_for(lambda: _served_by(STANDBY_ENGINE) > 0, "the new engine to serve a request", timeout_s=120)
        TIMELINE.mark("new engine served")
    finally:
        light.stop()
        heavy.stop()
    outcomes = heavy.outcomes + light.outcomes
    assert set(outcomes) == {200}, f"requests not answered: {dict(outcomes)}"
    # Prometheus follows the new membership: the new engine is scraped, and up.
    assert _scraped_engines() == BASE_ENGINES | {STANDBY_ENGINE}
    marks = TIMELINE.marks
    retried = heavy.retried_connections + light.retried_connections
    _report(f"scale-out: {sum(outcomes.values())} requests answered, {retried} broken connections retried "
          "with their Idempotency-Key")
    def span(start: str, stop: str) -> str:
        return f"{marks[stop] - marks[start]:.1f} s"

    _report(f"  load started to the condition true (seen by a scrape): {span('load started', 'condition true')}")
    _report(f"  alerting, condition true to the scaler's decision: {span('condition true', 'scaler took the alert')}"
          f" (for: {span('condition true', 'alert fired')}, group wait and webhook"
          f" {span('alert fired', 'scaler took the alert')})")
    _report(f"  Ansible, the decision to the first request served on {STANDBY_HOST}: "
          f"{span('scaler took the alert', 'new engine served')} (scale_out.yml {end['duration_s']:.1f} s)")


def test_quiet_removes_the_added_host_drained(scaler: subprocess.Popen[bytes]) -> None:
    assert "new engine served" in TIMELINE.marks, "the scale-out did not happen: nothing to scale in"
    quiet = time.time()
    decision = wait_for(partial(_scale_in_taken, scaler), "the scaler to take a scale-in",
                        timeout_s=300)
    assert decision["action"]["host"] == STANDBY_HOST, decision
    end = wait_for(partial(_action_end, decision["action"]["id"]), "the scale-in playbook to end", timeout_s=600)
    assert end["result"] == "successful", _run_output(end)
    # Drained, then removed: no engine container on gpu3, no request cut (the workers' drain), and Prometheus
    # no longer scrapes it, so no EngineDown follows.
    assert on_host(STANDBY_HOST, "docker", "ps", "-aq", "--filter", "label=llmfleet.role=vllm").strip() == ""
    assert _scraped_engines() == BASE_ENGINES
    _report(f"scale-in: quiet to scaler {decision['time'] - quiet:.1f} s, playbook {end['duration_s']:.1f} s")
    state = json.loads((SCALER_LOGS / "state" / "state.json").read_text())
    assert state["engines_added"] == [] and state["membership"]["engine_hosts"] == [], state
