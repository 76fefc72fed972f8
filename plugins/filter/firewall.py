"""The firewall role's guards, read from the inventory: which of a host's ports answer whom.

playbooks/firewall.yml passes the firewall role its guards, each {name, ports, v4, v6}:
the TCP ports of one kind of service on this host and the sources (addresses or
networks, by family) that may open connections to them; every other source is refused.

    firewall_guards: "{{ __llmfleet_scrape_targets | firewall_guards(address, engine_ports, redis_ports,
                                                                      sources) }}"

- vLLM engines (the host's vllm_engines ports): the gateway hosts, whose workers call
  them, and the monitoring hosts, whose Prometheus scrapes their /metrics.
- metrics (every exporter and ops port that Prometheus scrapes on this host, taken from
  its scrape targets, so no port is written twice): the monitoring hosts.
- Redis (redis_port on the Redis hosts): the gateway hosts, the monitoring hosts (the
  scaler and the exporter's scrape path) and the Redis hosts themselves (replication).

``sources`` maps gateways, monitoring, redis and trusted to lists of addresses; trusted
sources (an operators' network, the lab's controller) may reach every guarded port. An
address that is not an IP address or network is refused: the kernel's rules need numbers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

# Prometheus's jobs whose targets are this host's metrics ports (plugins/filter/monitoring.py).
METRICS_JOBS = ("gpu", "node", "redis", "gateway", "worker")
SOURCE_KEYS = ("gateways", "monitoring", "redis", "trusted")


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    address, _, port = endpoint.rpartition(":")
    return address.strip("[]"), int(port)


def _networks(addresses: Sequence[str], what: str) -> tuple[list[str], list[str]]:
    v4: list[str] = []
    v6: list[str] = []
    for address in addresses:
        try:
            network = ipaddress.ip_network(str(address), strict=False)
        except ValueError as error:
            raise AnsibleFilterError(
                f"firewall: {what} has {address!r}, which is not an IP address or network; the firewall's rules need "
                "numbers (set llmfleet_address to the host's IP address, or list networks in firewall_trusted_sources)"
            ) from error
        family = v4 if network.version == 4 else v6
        if str(network) not in family:
            family.append(str(network))
    return v4, v6


def firewall_guards(
    targets: Mapping[str, Sequence[str]],
    address: str,
    engine_ports: Sequence[Any],
    redis_ports: Sequence[Any],
    sources: Mapping[str, Sequence[str]],
) -> list[dict[str, Any]]:
    """The guards of the host at ``address``: [{name, ports, v4, v6}], those without ports left out."""
    missing = [key for key in SOURCE_KEYS if key not in sources]
    if missing:
        raise AnsibleFilterError(f"firewall_guards needs sources for {', '.join(missing)}")
    metrics: list[int] = []
    for job in METRICS_JOBS:
        for endpoint in targets.get(job, []):
            host, port = _split_endpoint(str(endpoint))
            if host == str(address) and port not in metrics:
                metrics.append(port)
    wanted = [
        ("vLLM engines", [int(port) for port in engine_ports], ["gateways", "monitoring"]),
        ("metrics", metrics, ["monitoring"]),
        ("Redis", [int(port) for port in redis_ports], ["gateways", "monitoring", "redis"]),
    ]
    guards = []
    for name, ports, groups in wanted:
        if not ports:
            continue
        allowed = [source for group in [*groups, "trusted"] for source in sources[group]]
        v4, v6 = _networks(allowed, f"the sources of {name}")
        guards.append({"name": name, "ports": sorted(set(ports)), "v4": v4, "v6": v6})
    return guards


class FilterModule:
    """llmfleet firewall filters."""

    def filters(self) -> dict[str, Any]:
        return {"firewall_guards": firewall_guards}
