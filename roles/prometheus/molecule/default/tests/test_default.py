"""What an operator notices on a host after the prometheus role ran.

converge.yml points the vllm job at two ports where nothing listens, the node and
gateway jobs at the server itself, and sets EngineDown's `for` to 0m, so the running
server must show those targets from file_sd and fire EngineDown for both engines.
"""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from llmfleet.paths import REPO_ROOT

API = "http://127.0.0.1:9090"
ALERTS_FILE = REPO_ROOT / "roles" / "prometheus" / "vars" / "alerts.yml"


def api(host, path: str) -> Any:
    """GET a Prometheus API path from inside the test host (it listens on loopback only)."""
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    out = host.check_output("python3 -c %s %s", fetch, f"{API}{path}")
    body = json.loads(out)
    assert body["status"] == "success", body
    return body["data"]


def wait_for(condition, what: str, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(1)


def test_prometheus_runs_enabled_with_the_roles_command_line(host) -> None:
    service = host.service("prometheus")
    assert service.is_running and service.is_enabled
    args = host.file("/etc/default/prometheus").content_string
    for flag in (
        "--web.listen-address=127.0.0.1:9090",
        "--storage.tsdb.retention.time=2d",
        "--storage.tsdb.retention.size=1GB",
    ):
        assert flag in args
    flags = api(host, "/api/v1/status/flags")
    assert flags["storage.tsdb.retention.time"] == "2d"
    # Prometheus reads size units as powers of 1024 and shows them so.
    assert flags["storage.tsdb.retention.size"] == "1GiB"


def test_promtool_accepts_the_configuration_on_the_host(host) -> None:
    result = host.run("promtool check config /etc/prometheus/prometheus.yml")
    assert result.rc == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_the_api_lists_every_alert_of_the_rules_data(host) -> None:
    expected = {rule["alert"] for rule in yaml.safe_load(ALERTS_FILE.read_text())["__prometheus_alert_rules"]}
    groups = api(host, "/api/v1/rules")["groups"]
    loaded = [rule for group in groups for rule in group["rules"] if rule["type"] == "alerting"]
    assert {rule["name"] for rule in loaded} == expected
    assert all(rule["health"] != "err" for rule in loaded), [r for r in loaded if r["health"] == "err"]
    kv_cache = next(rule for rule in loaded if rule["name"] == "KVCacheNearFull")
    assert "vllm:kv_cache_usage_perc" in kv_cache["query"]


def test_the_file_sd_targets_are_scraped(host) -> None:
    def targets() -> list[dict[str, Any]]:
        active = api(host, "/api/v1/targets?state=active")["activeTargets"]
        scraped = [target for target in active if target["health"] != "unknown"]
        return active if len(scraped) == len(active) == 5 else []

    active = wait_for(targets, "5 scraped targets")
    by_job = {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in active}
    assert by_job == {
        ("vllm", "127.0.0.1:18000"): "down",
        ("vllm", "127.0.0.1:18001"): "down",
        ("node", "127.0.0.1:9090"): "up",
        ("gateway", "127.0.0.1:9090"): "up",
        # Prometheus itself, a static target at its own address (AlertmanagerUnreachable reads its counters).
        ("prometheus", "127.0.0.1:9090"): "up",
    }
    empty = yaml.safe_load(host.file("/etc/prometheus/file_sd/gpu.yml").content_string)
    assert empty == []


def test_engine_down_fires_for_each_engine_that_does_not_answer(host) -> None:
    def firing() -> set[str]:
        alerts = api(host, "/api/v1/alerts")["alerts"]
        return {
            a["labels"]["instance"]
            for a in alerts
            if a["labels"]["alertname"] == "EngineDown" and a["state"] == "firing"
        }

    assert wait_for(lambda: firing() == {"127.0.0.1:18000", "127.0.0.1:18001"} or None, "EngineDown for both engines")


def test_alertmanager_is_configured(host) -> None:
    config = yaml.safe_load(api(host, "/api/v1/status/config")["yaml"])
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    gateway = next(job for job in config["scrape_configs"] if job["job_name"] == "gateway")
    assert gateway["scrape_interval"] == "5s"
