"""Unit tests for plugins/filter/maintenance.py: which alerts a maintenance silence covers, and where it is sent.

The matchers are checked against the labels the alerts really carry: the scrape targets the
scrape_targets filter derives from the same inventory (`instance`), and the `host` label
GPUMemoryHeldWithoutEngine cuts from them (roles/prometheus/vars/alerts.yml).
tests/integration/ops/test_maintenance_silence.py sends them to a real Alertmanager.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"llmfleet_filter_{name}", Path(__file__).parents[4] / "plugins" / "filter" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


maintenance = _load("maintenance")
monitoring = _load("monitoring")

ROLES = Path(__file__).parents[4] / "roles"
ROLE_DEFAULTS = {role: yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
                 for role in ("gateway", "worker", "node_exporter", "redis_exporter", "gpu_exporter")}
GROUP_NAMES = {"engines": "gpu_nodes", "standby": "gpu_standby", "gateways": "gateways", "redis": "redis",
               "all": "all"}
TINY = {"name": "tiny", "model": "tiny"}
HOSTVARS: dict[str, dict[str, Any]] = {
    "gw1": {"llmfleet_address": "10.0.0.10", "worker_count": 2},
    "redis1": {"llmfleet_address": "10.0.0.20"},
    "mon1": {"llmfleet_address": "10.0.0.30"},
    "gpu1": {"llmfleet_address": "10.0.0.41",
             "vllm_engines": [TINY | {"port": 8000}, TINY | {"name": "tiny-b", "port": 8001}]},
    # Engines published on another network than the exporters.
    "gpu2": {"llmfleet_address": "10.0.0.42", "vllm_publish_address": "10.1.0.42",
             "vllm_engines": [TINY | {"port": 8000}]},
    "gpu4": {"llmfleet_address": "10.0.0.4", "vllm_engines": [TINY | {"port": 8000}]},
    "gpu6": {"llmfleet_address": "fd00::46", "vllm_engines": [TINY | {"port": 8000}]},
    "gpu7": {"ansible_host": "gpu7.example.internal", "vllm_engines": [TINY | {"port": 8000}]},
}
GROUPS = {"all": list(HOSTVARS), "gateways": ["gw1"], "redis": ["redis1"], "monitoring": ["mon1"],
          "gpu_nodes": ["gpu1", "gpu2", "gpu4", "gpu6", "gpu7"], "gpu_standby": []}
# Every scrape target of the site, as Prometheus names it in `instance`.
TARGETS = monitoring.scrape_targets(GROUPS, HOSTVARS, GROUP_NAMES, ROLE_DEFAULTS)


def _labels_of(host: str) -> set[str]:
    """The `instance` of every target on the host: what the site's alerts carry."""
    own = {HOSTVARS[host].get(key) for key in ("llmfleet_address", "vllm_publish_address", "ansible_host")} - {None}
    own = {f"[{a}]" if ":" in a else a for a in own}
    return {target for targets in TARGETS.values() for target in targets if target.rsplit(":", 1)[0] in own}


def _silenced(matchers: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Alertmanager's rule: every matcher of a silence matches (regex matchers are anchored)."""
    for matcher in matchers:
        value = labels.get(matcher["name"], "")
        found = re.fullmatch(matcher["value"], value) if matcher["isRegex"] else value == matcher["value"]
        if bool(found) != matcher["isEqual"]:
            return False
    return True


def _any_silenced(silences: list[list[dict[str, Any]]], labels: dict[str, str]) -> bool:
    return any(_silenced(matchers, labels) for matchers in silences)


@pytest.mark.parametrize("host", ["gpu1", "gpu2", "gpu4", "gpu6", "gpu7"])
def test_every_alert_of_the_host_is_silenced_and_no_other_host_s(host: str) -> None:
    silences = maintenance.maintenance_silence_matchers(host, HOSTVARS)
    mine = _labels_of(host)
    assert mine, f"{host} has no target: the test site is wrong"
    everything = {target for targets in TARGETS.values() for target in targets}
    for instance in everything:
        # `instance` alerts (EngineDown, TargetDown, GPUXidErrors...), and GPUMemoryHeldWithoutEngine's `host`.
        assert _any_silenced(silences, {"alertname": "X", "instance": instance}) == (instance in mine), instance
        cut = re.sub(r":[0-9]+$", "", instance)
        assert _any_silenced(silences, {"alertname": "GPUMemoryHeldWithoutEngine", "host": cut}) == (
            instance in mine), cut
    # An alert with neither label (the scaling alerts, Watchdog, the queue's) is never silenced.
    assert not _any_silenced(silences, {"alertname": "Watchdog"})
    assert not _any_silenced(silences, {"alertname": "ScaleOutNeeded", "scale_kind": "engines"})


def test_engine_down_from_the_workers_view_is_silenced_too() -> None:
    # EngineDown's second rule takes `instance` from the engine URL the workers call (vllm_publish_address).
    silences = maintenance.maintenance_silence_matchers("gpu2", HOSTVARS)
    assert _any_silenced(silences, {"alertname": "EngineDown", "instance": "10.1.0.42:8000",
                                    "engine": "http://10.1.0.42:8000"})
    # gpu4's 10.0.0.4 is a prefix of gpu1's 10.0.0.41: anchored, it silences gpu4 only.
    assert not _any_silenced(maintenance.maintenance_silence_matchers("gpu4", HOSTVARS), {"instance": "10.0.0.41:8000"})


def test_one_silence_on_instance_and_one_on_host_sorted_as_alertmanager_returns_them() -> None:
    assert maintenance.maintenance_silence_matchers("gpu2", HOSTVARS) == [
        [{"name": "instance", "value": r"(10\.0\.0\.42|10\.1\.0\.42):[0-9]+", "isRegex": True, "isEqual": True}],
        [{"name": "host", "value": r"(10\.0\.0\.42|10\.1\.0\.42)", "isRegex": True, "isEqual": True}],
    ]
    assert maintenance.maintenance_silence_matchers("gpu1", HOSTVARS)[0][0]["value"] == r"10\.0\.0\.41:[0-9]+"
    assert maintenance.maintenance_silence_matchers("gpu6", HOSTVARS)[1][0]["value"] == r"\[fd00::46\]"


def test_a_run_for_the_workers_silences_only_the_worker_alerts_of_the_host() -> None:
    silences = maintenance.maintenance_silence_matchers("gw1", HOSTVARS, ["worker"])
    assert silences == [[
        {"name": "instance", "value": r"10\.0\.0\.10:[0-9]+", "isRegex": True, "isEqual": True},
        {"name": "job", "value": "worker", "isRegex": True, "isEqual": True},
    ]]
    assert _any_silenced(silences, {"alertname": "WorkerDown", "job": "worker", "instance": "10.0.0.10:9401"})
    assert not _any_silenced(silences, {"alertname": "GatewayDown", "job": "gateway", "instance": "10.0.0.10:9300"})
    assert not _any_silenced(silences, {"alertname": "TargetDown", "job": "node", "instance": "10.0.0.10:9100"})


def test_bad_input_is_refused() -> None:
    with pytest.raises(AnsibleFilterError, match="not in the inventory"):
        maintenance.maintenance_silence_matchers("nowhere", HOSTVARS)
    with pytest.raises(AnsibleFilterError, match="list of job names"):
        maintenance.maintenance_silence_matchers("gw1", HOSTVARS, "worker")


@pytest.mark.parametrize(
    ("variables", "url"),
    [
        ({"llmfleet_address": "10.0.0.30"}, "http://10.0.0.30:9093/api/v2"),
        ({"llmfleet_address": "10.0.0.30", "alertmanager_listen_address": "10.9.0.30", "alertmanager_port": "9193"},
         "http://10.9.0.30:9193/api/v2"),
        ({"alertmanager_listen_address": "0.0.0.0"}, "http://127.0.0.1:9093/api/v2"),  # noqa: S104 (a value read)
        ({"alertmanager_listen_address": "fd00::30"}, "http://[fd00::30]:9093/api/v2"),
        ({"ansible_facts": {"default_ipv4": {"address": "10.0.0.31"}}, "ansible_host": "mon1.example.internal"},
         "http://10.0.0.31:9093/api/v2"),
        ({"ansible_host": "mon1.example.internal"}, "http://mon1.example.internal:9093/api/v2"),
        ({"llmfleet_address": "10.0.0.30", "alertmanager_external_url": "https://alerts.example.internal/am/"},
         "http://10.0.0.30:9093/am/api/v2"),
    ],
)
def test_alertmanager_is_called_where_its_role_makes_it_listen(variables: dict[str, Any], url: str) -> None:
    assert maintenance.alertmanager_api_url(variables) == url


def _silence(state: str, created_by: str, matchers: list[dict[str, Any]], ident: str = "s1") -> dict[str, Any]:
    return {"id": ident, "status": {"state": state}, "createdBy": created_by, "matchers": matchers,
            "startsAt": "2026-12-04T10:00:00.000Z", "endsAt": "2026-12-04T10:30:00.000Z", "comment": "c"}


def test_a_silence_left_by_a_killed_run_is_reused_not_stacked() -> None:
    wanted = maintenance.maintenance_silence_matchers("gpu1", HOSTVARS)[0]
    # Alertmanager hands matchers back in its own key order.
    returned = [{"isEqual": True, "isRegex": True, "name": "instance", "value": wanted[0]["value"]}]
    silences = [
        _silence("expired", "llmfleet engines.yml", returned, "old"),
        _silence("active", "alice", returned, "a-person-s"),
        _silence("active", "llmfleet gpu_hosts.yml", returned, "ours"),
    ]
    assert maintenance.maintenance_silence_reusable(silences, wanted)["id"] == "ours"
    assert maintenance.maintenance_silence_reusable(silences[:2], wanted) == {}
    other = maintenance.maintenance_silence_matchers("gpu4", HOSTVARS)[0]
    assert maintenance.maintenance_silence_reusable(silences, other) == {}
    with pytest.raises(AnsibleFilterError, match="GET /api/v2/silences"):
        maintenance.maintenance_silence_reusable("not a list", wanted)
