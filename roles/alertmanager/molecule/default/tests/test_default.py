"""What an operator notices after the alertmanager role ran (converge.yml: a test token, 1 s group waits).

prepare.yml runs a STAND-IN scaler webhook (a recorder) at 127.0.0.1:9095, the
role's default scaler URL; the tests post alerts to Alertmanager's API, as
Prometheus does, and read what reached the recorder.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

TOKEN = "molecule-test-only-scaler-token-41d9"  # TEST VALUE ONLY, as converge.yml sets it
PORT = 9093
SERVICE = "prometheus-alertmanager"
CALLS = "/var/lib/molecule-webhook/calls.jsonl"


@pytest.fixture(scope="module")
def api(host) -> str:
    return f"http://{host.check_output('hostname -I').split()[0]}:{PORT}/api/v2"


def wait_for(condition: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.5)
    return result


def post_alerts(api: str, *labelsets: dict[str, str]) -> None:
    alerts = [{"labels": labels, "annotations": {"summary": "molecule test"}} for labels in labelsets]
    httpx.post(f"{api}/alerts", json=alerts, timeout=10).raise_for_status()


def calls(host) -> list[dict[str, Any]]:
    text = host.file(CALLS).content_string if host.file(CALLS).exists else ""
    return [json.loads(line) for line in text.splitlines()]


def test_the_service_runs_and_starts_at_boot(host):
    service = host.service(SERVICE)
    assert service.is_running
    assert service.is_enabled


def test_it_listens_on_the_hosts_address_only_and_does_not_gossip(host):
    address = host.check_output("hostname -I").split()[0]
    assert host.socket(f"tcp://{address}:{PORT}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{PORT}").is_listening
    assert not host.socket("tcp://0.0.0.0:9094").is_listening  # the cluster port


def test_the_token_is_a_file_only_the_service_user_reads(host):
    token = host.file("/etc/prometheus/alertmanager_scaler_token")
    assert (token.user, token.mode) == ("prometheus", 0o400)
    config = host.file("/etc/prometheus/alertmanager.yml")
    assert (config.user, config.group, config.mode) == ("root", "prometheus", 0o640)
    assert TOKEN not in config.content_string
    assert TOKEN not in host.check_output("ps auxww")


def test_the_running_configuration_has_the_scaler_and_passes_amtool(host, api):
    status = httpx.get(f"{api}/status", timeout=10).json()
    config = yaml.safe_load(status["config"]["original"])
    assert {receiver["name"] for receiver in config["receivers"]} == {"operators", "chat", "watchdog", "scaler"}
    host.run_expect([0], "amtool check-config /etc/prometheus/alertmanager.yml")


def test_a_scaling_alert_reaches_the_scaler_with_the_token(host, api):
    run = uuid.uuid4().hex[:8]
    post_alerts(api, {"alertname": "ScaleOutNeeded", "scale_action": "out", "scale_kind": "workers", "run": run})
    call = wait_for(lambda: next((c for c in calls(host) if any(
        a["labels"].get("run") == run for a in c["body"]["alerts"])), None))
    assert call["authorization"] == f"Bearer {TOKEN}"
    assert call["path"] == "/alerts"
    body = call["body"]
    assert body["version"] == "4" and body["receiver"] == "scaler" and body["status"] == "firing"
    assert body["groupLabels"] == {"alertname": "ScaleOutNeeded", "scale_action": "out", "scale_kind": "workers"}


def test_other_alerts_do_not_reach_the_scaler(host, api):
    run = uuid.uuid4().hex[:8]
    post_alerts(api, {"alertname": "RedisMemoryHigh", "instance": "redis1:9121", "run": run})
    # The operators' receiver has no integration here: the alert is grouped under it and sent nowhere.
    group = wait_for(lambda: next((g for g in httpx.get(f"{api}/alerts/groups", timeout=10).json()
                                   if any(a["labels"].get("run") == run for a in g["alerts"])), None))
    assert group["receiver"]["name"] == "operators"
    time.sleep(3)  # two scaler group intervals: a wrongly routed alert would have been sent by now
    assert not [c for c in calls(host) if any(a["labels"].get("run") == run for a in c["body"]["alerts"])]


def test_a_dead_engine_inhibits_its_own_latency_alert_only(api):
    run = uuid.uuid4().hex[:8]
    post_alerts(api,
                {"alertname": "EngineDown", "instance": "10.0.0.1:8000", "run": run},
                {"alertname": "TTFTp95High", "instance": "10.0.0.1:8000", "run": run},
                {"alertname": "TTFTp95High", "instance": "10.0.0.2:8000", "run": run})

    def states() -> dict[str, str] | None:
        alerts = [a for a in httpx.get(f"{api}/alerts", timeout=10).json() if a["labels"].get("run") == run]
        found = {f"{a['labels']['alertname']}@{a['labels']['instance']}": a["status"]["state"] for a in alerts}
        return found if len(found) == 3 and "suppressed" in found.values() else None

    assert wait_for(states) == {
        "EngineDown@10.0.0.1:8000": "active",
        "TTFTp95High@10.0.0.1:8000": "suppressed",
        "TTFTp95High@10.0.0.2:8000": "active",
    }
