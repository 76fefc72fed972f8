"""The monitoring layer of the whole-stack lab: Prometheus and Alertmanager on mon1 watching the real site.

Runs against the converged test lab (the `converged_site` fixture: site.yml,
which imports playbooks/monitoring.yml). Nothing here changes the site's
configuration, so test_site.py's second-run and check-mode tests, which follow,
still judge the same site; the Redis outage test stops Redis and starts it
again, and waits until the services are ready. The lab has no GPU: no gpu
target (docs/monitoring.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.lab.alert_sink import AlertSink
from tests.lab.helpers import PlaybookRun, on_host, prometheus, wait_for
from tests.tools import LLMFLEET

MONITORING_ADDRESS = "10.78.0.30"  # mon1 in the test lab (inventories/lab, moved to 10.78.0.0/24)
ALERTMANAGER = f"http://{MONITORING_ADDRESS}:9093"
# lab_controller_address in the test lab: the lab's scaler runs on the build machine (tests/lab/test_scaling.py).
SCALER_ADDRESS = "10.78.0.1"
HOSTS = {"gw1": "10.78.0.10", "redis1": "10.78.0.20", "mon1": "10.78.0.30",
         "gpu1": "10.78.0.41", "gpu2": "10.78.0.42", "gpu3": "10.78.0.43"}
# Every target the inventory implies, by job: engines where the workers call them (gpu1 runs two), the gateway's ops
# listener (gateway_ops_port 9300, not the API port) and its two workers (worker_metrics_port 9400 + N - 1), the
# Redis exporter, a node exporter on every host, Prometheus itself (its notification counters feed
# AlertmanagerUnreachable), at its listen address, and the scaler where Alertmanager posts to it
# (alertmanager_scaler_url: its results feed ScalerActionFailed, ScalerGaveUp and ScalerStuck).
EXPECTED_TARGETS = {
    ("scaler", f"{SCALER_ADDRESS}:9095"),
    ("prometheus", f"{MONITORING_ADDRESS}:9090"),
    ("vllm", "10.78.0.41:8000"), ("vllm", "10.78.0.41:8001"), ("vllm", "10.78.0.42:8000"),
    ("gateway", "10.78.0.10:9300"),
    ("worker", "10.78.0.10:9400"), ("worker", "10.78.0.10:9401"),
    ("redis", "10.78.0.20:9121"),
    *{("node", f"{address}:9100") for address in HOSTS.values()},
}
ALERTS = {"QueueBacklogHigh", "QueueWaitHigh", "QueueStalled", "ScaleOutNeeded", "ScaleInPossible", "KVCacheNearFull",
          "EngineDown", "WorkerDown", "GatewayDown", "TTFTp95High", "PreemptionsHigh", "DeadLetterGrowing",
          "RedisMemoryHigh", "RedisDown", "GatewayErrorsHigh", "RequestsLost", "WorkerErrorsHigh", "TargetDown",
          "DiskFillingUp", "AlertmanagerUnreachable", "Watchdog", "GPUUnderutilizedWhileQueued",
          "GPUMemoryHeldWithoutEngine", "GPUXidErrors", "GPUTemperatureHigh", "GPUEccErrors",
          "ScalerActionFailed", "ScalerGaveUp", "ScalerStuck"}
RECORDS = {"instance:vllm_prefix_cache_hits:rate", "instance:vllm_prefix_cache_queries:rate",
           "instance:vllm_prefix_cache_hit_ratio:rate", "job:vllm_prefix_cache_hit_ratio:rate"}
# Fires all the time by design (the dead man's switch's heartbeat): never a sign that something is wrong.
ALWAYS_FIRING = {"Watchdog"}
LAB_SECRETS = {"redis1": "lab-only-not-a-secret-exporter-3c8d", "mon1": "lab-only-not-a-secret-scaler-token-a61f"}


def _query(query: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = prometheus("query", query=query)["result"]
    return result


@pytest.fixture(scope="module", autouse=True)
def converged(converged_site: PlaybookRun) -> None:
    assert converged_site.returncode == 0, converged_site.output[-5000:]


@pytest.fixture(scope="module", autouse=True)
def scaler(converged: None, lab_inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The lab's scaler on the build machine, in dry-run mode (it decides, runs nothing), while this module runs.

    The lab runs its scaler only while a test needs it (test_scaling.py starts its own after this module): here it
    is up so that Prometheus's scaler target is, as on a site where it runs all the time.
    """
    scratch = tmp_path_factory.mktemp("monitoring-scaler")
    secrets = yaml.safe_load((lab_inventory / "group_vars" / "all" / "lab_secrets.yml").read_text())
    token_file = scratch / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(secrets["alertmanager_scaler_token"])
    settings = {"TOKEN_FILE": str(token_file), "PROJECT_DIR": str(REPO_ROOT),
                "INVENTORY": json.dumps([str(lab_inventory)]), "HOST": SCALER_ADDRESS, "PORT": "9095",
                "STATE_DIR": str(scratch / "state"), "DRY_RUN": "true"}
    env = {**os.environ, **{f"LLMFLEET_SCALER_{name}": value for name, value in settings.items()}}
    with (scratch / "scaler.log").open("wb") as log:
        process = subprocess.Popen([*LLMFLEET, "scaler", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or _scaler_healthy(), "the scaler to answer /healthz",
                 timeout_s=60)
        assert process.poll() is None, (scratch / "scaler.log").read_text()
        yield
    finally:
        process.terminate()
        process.wait(60)


def _scaler_healthy() -> bool:
    try:
        return httpx.get(f"http://{SCALER_ADDRESS}:9095/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _targets() -> dict[tuple[str, str], str]:
    active = prometheus("targets", state="active")["activeTargets"]
    return {(target["labels"]["job"], target["labels"]["instance"]): target["health"] for target in active}


def _all_up() -> dict[tuple[str, str], str] | None:
    found = _targets()
    return found if set(found.values()) == {"up"} else None


def _rules(kind: str = "alert") -> list[dict[str, Any]]:
    return [rule for group in prometheus("rules", type=kind)["groups"] for rule in group["rules"]]


def _all_evaluated(kind: str = "alert") -> list[dict[str, Any]] | None:
    rules = _rules(kind)
    return rules if all(rule.get("lastEvaluation", "").startswith("20") for rule in rules) else None


def _discovered() -> dict[tuple[str, str], str] | None:
    # Prometheus lists its targets only after its first reload of the written configuration: wait for a list.
    return _targets() or None


def test_prometheus_scrapes_every_target_of_the_inventory_and_each_is_up() -> None:
    assert set(wait_for(_discovered, "Prometheus to list its targets")) == EXPECTED_TARGETS
    assert set(wait_for(_all_up, "every target up", timeout_s=180)) == EXPECTED_TARGETS


def test_every_alert_rule_is_loaded_and_evaluates_cleanly() -> None:
    assert {rule["name"] for rule in _rules()} == ALERTS
    # Every rule evaluated without an error against the real series (that a rule names only exported metrics is
    # the prometheus role's unit tests' job).
    evaluated = wait_for(_all_evaluated, "every rule evaluated")
    assert not [(rule["name"], rule.get("lastError")) for rule in evaluated if rule["health"] != "ok"]
    # The recording rules the lab's vLLM 0.32.0 gets (roles/prometheus/vars/records.yml) load and evaluate too.
    records = wait_for(partial(_all_evaluated, "record"), "every recording rule evaluated")
    assert {rule["name"] for rule in records} == RECORDS
    assert not [(rule["name"], rule.get("lastError")) for rule in records if rule["health"] != "ok"]


def test_a_healthy_lab_has_nothing_down() -> None:
    firing = prometheus("query", query='ALERTS{alertname=~"EngineDown|WorkerDown|GatewayDown|RedisDown|TargetDown"}')
    assert firing["result"] == []
    # Watchdog is left out of "nothing firing" on purpose: it always fires (ALWAYS_FIRING). That it does, with
    # severity none and no scale_action, shows the rules are evaluated and that it can never scale anything.
    watchdog = wait_for(lambda: _query('ALERTS{alertname="Watchdog",alertstate="firing"}'), "Watchdog to fire")
    assert [(sample["metric"]["severity"], sample["metric"].get("scale_action")) for sample in watchdog] == [
        ("none", None)]


def test_the_metrics_behind_the_alerts_arrive() -> None:
    # Each job's own series, read through Prometheus as the rules read them.
    for query, jobs in [
        ("vllm:num_requests_waiting", {"vllm"}),
        ("llmfleet_queue_depth", {"worker"}),
        ("llmfleet_engine_up", {"worker"}),
        ("llmfleet_engine_drained", {"worker"}),
        ("llmfleet_queue_waiting", {"worker"}),
        ("llmfleet_queue_oldest_wait_seconds", {"worker"}),
        ("prometheus_notifications_sent_total", {"prometheus"}),
        ("llmfleet_gateway_redis_up", {"gateway"}),
        ("redis_memory_max_bytes > 0", {"redis"}),
        ("node_memory_MemAvailable_bytes", {"node"}),
        ("llmfleet_scaler_playbook_timeout_seconds", {"scaler"}),
    ]:
        result: list[dict[str, Any]] = wait_for(partial(_query, query), f"series for {query}")
        assert {sample["metric"]["job"] for sample in result} == jobs, query
    assert {s["value"][1] for s in prometheus("query", query="redis_up")["result"]} == {"1"}


def test_prometheus_sends_alerts_to_alertmanager() -> None:
    active = wait_for(lambda: prometheus("alertmanagers")["activeAlertmanagers"], "an active Alertmanager")
    assert [am["url"] for am in active] == [f"{ALERTMANAGER}/api/v2/alerts"]


def test_alertmanager_is_ready_and_routes_scaling_alerts_to_the_scaler() -> None:
    assert httpx.get(f"{ALERTMANAGER}/-/ready", timeout=10).status_code == 200
    config = yaml.safe_load(httpx.get(f"{ALERTMANAGER}/api/v2/status", timeout=10).json()["config"]["original"])
    scaler = next(receiver for receiver in config["receivers"] if receiver["name"] == "scaler")
    webhook = scaler["webhook_configs"][0]
    assert webhook["url"] == f"http://{SCALER_ADDRESS}:9095/alerts"  # the lab's scaler, on the build machine
    assert webhook["http_config"]["authorization"]["credentials_file"] == "/etc/prometheus/alertmanager_scaler_token"
    # Severity routing, first match wins: Watchdog to its dead man's switch (never the scaler, never paged), the
    # scaling alerts to the scaler, critical to the operators, warning to chat.
    routes = config["route"]["routes"]
    assert [(route["receiver"], route["matchers"]) for route in routes] == [
        ("watchdog", ['alertname="Watchdog"']), ("scaler", ['scale_action=~"out|in"']),
        ("operators", ['severity="critical"']), ("chat", ['severity="warning"'])]
    assert any(rule["source_matchers"] == ['alertname="EngineDown"'] and rule["equal"] == ["instance"]
               for rule in config["inhibit_rules"])
    # Alertmanager hands its configuration back with each rule's matchers sorted by label name: compare as sets.
    assert any(set(rule["source_matchers"]) == {'severity="critical"', 'instance=~".+"'}
               and rule["target_matchers"] == ['severity="warning"'] and rule["equal"] == ["instance"]
               for rule in config["inhibit_rules"])


def test_monitoring_secrets_stay_in_root_or_service_only_files() -> None:
    assert on_host("mon1", "stat", "-c", "%a %U", "/etc/prometheus/alertmanager_scaler_token").split() == [
        "400", "prometheus"]
    assert on_host("redis1", "stat", "-c", "%a %U", "/etc/default/prometheus-redis-exporter").split() == [
        "600", "root"]
    for host, secret in LAB_SECRETS.items():
        assert secret not in on_host(host, "ps", "auxww"), host
        assert secret not in on_host(host, "journalctl", "--no-pager", "-q"), host


def test_redis_down_reaches_the_operators_from_both_views_and_clears(alert_sink: AlertSink) -> None:
    # Issue 34, lab scenario 4: stop Redis for longer than RedisDown's `for:` (15 s in the lab). The exporter's view
    # (redis_up) and the gateway's own (llmfleet_gateway_redis_up) both page the operators, through Alertmanager's
    # real routing and Slack-compatible notifier, and both clear once Redis is back.
    instances = {f"{HOSTS['redis1']}:9121", f"{HOSTS['gw1']}:9300"}
    seen = len(alert_sink.chat_titles())

    def redis_down(state: str) -> set[str] | None:
        titles = [title.split() for title in alert_sink.chat_titles()[seen:] if title.startswith(state)]
        found = {words[2] for words in titles if len(words) > 2 and words[1] == "RedisDown"}
        return found if found >= instances else None

    on_host("redis1", "systemctl", "stop", "redis-server")
    try:
        assert wait_for(partial(redis_down, "[FIRING"), "RedisDown from both views in the chat", timeout_s=180)
    finally:
        on_host("redis1", "systemctl", "start", "redis-server")
    assert wait_for(partial(redis_down, "[RESOLVED]"), "RedisDown resolved in the chat", timeout_s=180)
    # The services reconnect by themselves: the tests that follow find the site serving.
    for url in (f"http://{HOSTS['gw1']}:9300/readyz", f"http://{HOSTS['gw1']}:9400/readyz",
                f"http://{HOSTS['gw1']}:9401/readyz"):
        wait_for(partial(_answers_ok, url), f"{url} ready after Redis came back", timeout_s=120)


def test_the_watchdog_reaches_its_dead_mans_switch(alert_sink: AlertSink) -> None:
    # The heartbeat an external dead man's switch watches (alertmanager_watchdog_url). After the Redis test, so
    # that its first post has long arrived and the wait costs the lab nothing.
    posts = wait_for(lambda: alert_sink.posts("/watchdog"), "the Watchdog to reach its webhook", timeout_s=120)
    assert {alert["labels"]["alertname"] for post in posts for alert in post["alerts"]} == {"Watchdog"}


def _answers_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False
