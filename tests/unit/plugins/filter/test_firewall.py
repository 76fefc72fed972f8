"""Unit tests for plugins/filter/firewall.py: which of a host's ports answer whom, read from the inventory.

The scrape targets are the ones plugins/filter/monitoring.py makes for a site shaped like the lab (one gateway
host, one Redis host, one monitoring host, two GPU hosts): the firewall takes a host's metrics ports from them.
"""

from __future__ import annotations

from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from llmfleet.paths import REPO_ROOT
from tests.tools import load_plugin

firewall = load_plugin(REPO_ROOT / "plugins" / "filter" / "firewall.py", "llmfleet_filter_firewall")

TARGETS = {
    "vllm": ["10.0.0.41:8000", "10.0.0.41:8001", "10.0.0.42:8000"],
    "gateway": ["10.0.0.10:9300"],
    "worker": ["10.0.0.10:9400", "10.0.0.10:9401"],
    "redis": ["10.0.0.20:9121"],
    "node": ["10.0.0.10:9100", "10.0.0.20:9100", "10.0.0.30:9100", "10.0.0.41:9100", "10.0.0.42:9100"],
    "gpu": ["10.0.0.41:9500", "10.0.0.42:9500"],
    "scaler": ["10.0.0.30:9095"],
}
SOURCES = {"gateways": ["10.0.0.10"], "monitoring": ["10.0.0.30"], "redis": ["10.0.0.20"],
           "trusted": ["192.168.7.0/24", "2001:db8::/64"]}


def _guards(address: str, engine_ports: list[Any], redis_ports: list[Any]) -> dict[str, dict[str, Any]]:
    return {guard["name"]: guard
            for guard in firewall.firewall_guards(TARGETS, address, engine_ports, redis_ports, SOURCES)}


def test_a_gpu_host_opens_its_engines_to_gateways_and_monitoring_and_its_exporters_to_monitoring() -> None:
    guards = _guards("10.0.0.41", [8000, "8001"], [])
    assert guards == {
        "vLLM engines": {"name": "vLLM engines", "ports": [8000, 8001],
                         "v4": ["10.0.0.10/32", "10.0.0.30/32", "192.168.7.0/24"], "v6": ["2001:db8::/64"]},
        "metrics": {"name": "metrics", "ports": [9100, 9500], "v4": ["10.0.0.30/32", "192.168.7.0/24"],
                    "v6": ["2001:db8::/64"]},
    }


def test_the_redis_host_opens_redis_to_gateways_monitoring_and_its_peers() -> None:
    guards = _guards("10.0.0.20", [], [6379])
    assert guards["Redis"]["ports"] == [6379]
    assert guards["Redis"]["v4"] == ["10.0.0.10/32", "10.0.0.30/32", "10.0.0.20/32", "192.168.7.0/24"]
    assert guards["metrics"]["ports"] == [9100, 9121]
    assert "vLLM engines" not in guards


def test_the_gateway_host_guards_its_ops_and_worker_ports_not_its_api() -> None:
    guards = _guards("10.0.0.10", [], [])
    assert list(guards) == ["metrics"]
    assert guards["metrics"]["ports"] == [9100, 9300, 9400, 9401]


def test_a_host_with_nothing_to_guard_gets_no_guard() -> None:
    assert firewall.firewall_guards({}, "10.0.0.99", [], [], SOURCES) == []


def test_a_source_that_is_a_name_is_refused_with_what_to_set() -> None:
    sources = {**SOURCES, "gateways": ["gw1.example.internal"]}
    refusal = r"'gw1.example.internal', which is not an IP address.*llmfleet_address"
    with pytest.raises(AnsibleFilterError, match=refusal):
        firewall.firewall_guards(TARGETS, "10.0.0.41", [8000], [], sources)


def test_missing_source_groups_are_named() -> None:
    with pytest.raises(AnsibleFilterError, match="needs sources for redis, trusted"):
        firewall.firewall_guards(TARGETS, "10.0.0.41", [8000], [], {"gateways": [], "monitoring": []})
