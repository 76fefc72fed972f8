"""Unit tests for plugins/filter/monitoring.py: Prometheus's scrape targets read from the inventory."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError

_SPEC = importlib.util.spec_from_file_location(
    "llmfleet_filter_monitoring", Path(__file__).parents[4] / "plugins" / "filter" / "monitoring.py"
)
assert _SPEC and _SPEC.loader
monitoring = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(monitoring)

ROLES = Path(__file__).parents[4] / "roles"
# The roles' own defaults, as playbooks/monitoring.yml reads them.
ROLE_DEFAULTS = {role: yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
                 for role in ("gateway", "worker", "node_exporter", "redis_exporter", "gpu_exporter")}
GROUP_NAMES = {"engines": "gpu_nodes", "standby": "gpu_standby", "gateways": "gateways", "redis": "redis",
               "all": "all"}
TINY = {"name": "tiny", "model": "tiny"}


def _site() -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    hostvars: dict[str, dict[str, Any]] = {
        "gw1": {"llmfleet_address": "10.0.0.10", "gateway_count": 2, "worker_count": 3},
        "redis1": {"llmfleet_address": "10.0.0.20"},
        "mon1": {"llmfleet_address": "10.0.0.30"},
        "gpu1": {"llmfleet_address": "10.0.0.41",
                 "vllm_engines": [TINY | {"port": 8000}, TINY | {"name": "tiny-b", "port": 8001}]},
        "gpu2": {"llmfleet_address": "10.0.0.42", "vllm_publish_address": "10.1.0.42",
                 "vllm_engines": [TINY | {"port": 8000}]},
        "gpu3": {"llmfleet_address": "10.0.0.43", "vllm_engines": [TINY | {"port": 8000}]},
    }
    groups = {"all": list(hostvars), "gateways": ["gw1"], "redis": ["redis1"], "monitoring": ["mon1"],
              "gpu_nodes": ["gpu1", "gpu2"], "gpu_standby": ["gpu3"]}
    return groups, hostvars


def test_every_job_gets_its_targets_from_the_inventory() -> None:
    groups, hostvars = _site()
    targets = monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS)
    assert targets == {
        # Where the workers call each engine: gpu2 publishes its engines on another address.
        "vllm": ["10.0.0.41:8000", "10.0.0.41:8001", "10.1.0.42:8000"],
        "gateway": ["10.0.0.10:9300", "10.0.0.10:9301"],
        "worker": ["10.0.0.10:9400", "10.0.0.10:9401", "10.0.0.10:9402"],
        "redis": ["10.0.0.20:9121"],
        "node": ["10.0.0.10:9100", "10.0.0.20:9100", "10.0.0.30:9100", "10.0.0.41:9100", "10.0.0.42:9100",
                 "10.0.0.43:9100"],
        # Standby hosts' GPUs are watched too (GPUMemoryHeldWithoutEngine); their engines are not scraped.
        "gpu": ["10.0.0.41:9400", "10.0.0.42:9400", "10.0.0.43:9400"],
        # No scaler URL given: no scaler target.
        "scaler": [],
    }


@pytest.mark.parametrize(
    ("url", "target"),
    [
        # The alertmanager role's default: the scaler on the monitoring host, beside Prometheus.
        (yaml.safe_load((ROLES / "alertmanager" / "defaults" / "main.yml").read_text())["alertmanager_scaler_url"],
         "127.0.0.1:9095"),
        ("http://10.77.0.1:9095/alerts", "10.77.0.1:9095"),  # the lab's: the build machine
        ("https://scaler.example.internal/alerts", "scaler.example.internal:443"),
        ("http://[fd00::1]:9095/alerts", "[fd00::1]:9095"),
        ("", None),  # no scaling route: nothing to scrape
    ],
)
def test_the_scaler_is_scraped_where_alertmanager_posts_to_it(url: str, target: str | None) -> None:
    groups, hostvars = _site()
    targets = monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS, url)
    assert targets["scaler"] == ([target] if target else [])


@pytest.mark.parametrize("url", ["ftp://10.0.0.1/alerts", "http:///alerts", "http://10.0.0.1:port/alerts"])
def test_a_scaler_url_that_is_no_http_address_is_refused(url: str) -> None:
    groups, hostvars = _site()
    with pytest.raises(AnsibleFilterError, match="the scaler's URL"):
        monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS, url)


def test_a_host_setting_wins_over_the_role_default() -> None:
    groups, hostvars = _site()
    hostvars["gw1"] |= {"gateway_ops_port": 18080, "worker_metrics_port": 19000, "worker_count": 1}
    hostvars["redis1"]["redis_exporter_port"] = 19121
    hostvars["mon1"]["node_exporter_port"] = 19100
    targets = monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS)
    assert targets["gateway"] == ["10.0.0.10:18080", "10.0.0.10:18081"]
    assert targets["worker"] == ["10.0.0.10:19000"]
    assert targets["redis"] == ["10.0.0.20:19121"]
    assert "10.0.0.30:19100" in targets["node"]


def test_gateways_are_scraped_on_their_ops_address_not_the_api_one() -> None:
    groups, hostvars = _site()
    hostvars["gw1"]["gateway_publish_address"] = "203.0.113.10"
    assert monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS)["gateway"] == [
        "203.0.113.10:9300", "203.0.113.10:9301"]
    hostvars["gw1"]["gateway_ops_publish_address"] = "10.9.0.10"
    assert monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS)["gateway"] == [
        "10.9.0.10:9300", "10.9.0.10:9301"]


def test_hosts_with_the_gpu_exporter_off_get_no_gpu_target() -> None:
    groups, hostvars = _site()
    for host in ("gpu1", "gpu2", "gpu3"):
        hostvars[host]["gpu_exporter_enabled"] = False
    assert monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS)["gpu"] == []


def test_other_group_names_and_no_standby_group() -> None:
    groups, hostvars = _site()
    groups["serving"] = groups.pop("gpu_nodes")
    del groups["gpu_standby"]
    names = GROUP_NAMES | {"engines": "serving"}
    targets = monitoring.scrape_targets(groups, hostvars, names, ROLE_DEFAULTS)
    assert targets["gpu"] == ["10.0.0.41:9400", "10.0.0.42:9400"]


def test_an_ipv6_address_is_bracketed() -> None:
    groups, hostvars = _site()
    hostvars["redis1"]["llmfleet_address"] = "fd00::20"
    assert monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS)["redis"] == ["[fd00::20]:9121"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda g, h: g.pop("gateways"), "group 'gateways' is not in the inventory"),
        (lambda g, h: h["gw1"].update(gateway_ops_port="eighty"), "gateway_ops_port must be a whole number"),
        (lambda g, h: h["gpu1"].update(vllm_engines=[{"name": "x"}]), "gpu1: every entry of vllm_engines needs a port"),
        (lambda g, h: g["redis"].append("ghost"), "host 'ghost' is not in the inventory"),
    ],
    ids=["missing group", "bad port", "engine without port", "unknown host"],
)
def test_bad_inventory_is_refused_with_what_is_wrong(change: Any, message: str) -> None:
    groups, hostvars = _site()
    change(groups, hostvars)
    with pytest.raises(AnsibleFilterError, match=message):
        monitoring.scrape_targets(groups, hostvars, GROUP_NAMES, ROLE_DEFAULTS)


def test_group_names_must_all_be_given() -> None:
    groups, hostvars = _site()
    with pytest.raises(AnsibleFilterError, match="needs group names for redis"):
        monitoring.scrape_targets(groups, hostvars, {k: v for k, v in GROUP_NAMES.items() if k != "redis"},
                                  ROLE_DEFAULTS)
