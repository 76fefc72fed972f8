"""Filters that read Prometheus's scrape targets out of the inventory.

playbooks/monitoring.yml passes the prometheus role its targets by job
(vllm, gateway, worker, redis, node, gpu, scaler), each a list of "host:port",
derived from the inventory groups and each host's variables, so no address or
port is written twice:

    prometheus_targets: "{{ groups | scrape_targets(hostvars, __groups, __role_defaults, scaler_url) }}"

The scaler's target is where Alertmanager posts the scaling alerts
(alertmanager_scaler_url): Alertmanager runs beside Prometheus on the
monitoring hosts, so Prometheus reaches the scaler at the same address.

`role_defaults` maps a role name to its defaults/main.yml (read on the
controller): a port or count a host does not set is the role's default. Only
plain numbers are read from them, never templated values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ansible.errors import AnsibleFilterError

JOBS = ("vllm", "gateway", "worker", "redis", "node", "gpu", "scaler")
# The inventory groups each job's targets come from.
GROUP_KEYS = ("engines", "standby", "gateways", "redis", "all")


def _address(variables: Mapping[str, Any], host: str) -> str:
    """Where other hosts reach the host: the inventory's llmfleet_address, else ansible_host, else its name."""
    for key in ("llmfleet_address", "ansible_host"):
        value = variables.get(key)
        if value:
            return str(value)
    return host


def _setting(variables: Mapping[str, Any], defaults: Mapping[str, Any], key: str) -> int:
    """A whole-number setting of the host (e.g. gateway_port), else its role's default."""
    value = variables.get(key, defaults.get(key))
    try:
        return int(value)
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(
            f"{key} must be a whole number (the host's or its role's default), not {value!r}"
        ) from error


def _hosts(groups: Mapping[str, Sequence[str]], name: str, *, required: bool) -> list[str]:
    if name not in groups:
        if required:
            raise AnsibleFilterError(f"group '{name}' is not in the inventory")
        return []
    return list(groups[name])


def _endpoint(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _url_endpoint(url: str) -> str:
    """host:port of an http(s) URL, the scheme's port when it names none."""
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}[parts.scheme]
    except (KeyError, ValueError) as error:
        raise AnsibleFilterError(f"the scaler's URL must be http(s)://host[:port]/..., not {url!r}") from error
    if not parts.hostname:
        raise AnsibleFilterError(f"the scaler's URL names no host: {url!r}")
    return _endpoint(parts.hostname, port)


def scrape_targets(
    groups: Mapping[str, Sequence[str]],
    hostvars: Mapping[str, Any],
    group_names: Mapping[str, str],
    role_defaults: Mapping[str, Mapping[str, Any]],
    scaler_url: str = "",
) -> dict[str, list[str]]:
    """Prometheus's targets by job, "host:port" each, in inventory order.

    group_names maps engines, standby, gateways, redis and all to the
    inventory's group names. Engines are published where the workers call them
    (vllm_publish_address, as the engine_urls filter reads it), so EngineDown's
    `instance` is the engine the workers name. A GPU host gets a gpu target
    unless gpu_exporter_enabled is false for it. The scaler is scraped at the
    host:port of scaler_url (alertmanager_scaler_url; empty: no scaler target).
    """
    missing = [key for key in GROUP_KEYS if key not in group_names]
    if missing:
        raise AnsibleFilterError(f"scrape_targets needs group names for {', '.join(missing)}")
    targets: dict[str, list[str]] = {job: [] for job in JOBS}

    def add(job: str, endpoint: str) -> None:
        if endpoint not in targets[job]:
            targets[job].append(endpoint)

    def variables_of(host: str) -> Mapping[str, Any]:
        if host not in hostvars:
            raise AnsibleFilterError(f"host '{host}' is not in the inventory")
        found: Mapping[str, Any] = hostvars[host]
        return found

    engine_hosts = _hosts(groups, group_names["engines"], required=True)
    gpu_hosts = engine_hosts + [h for h in _hosts(groups, group_names["standby"], required=False)
                                if h not in engine_hosts]
    for host in engine_hosts:
        variables = variables_of(host)
        address = str(variables.get("vllm_publish_address") or _address(variables, host))
        for engine in variables.get("vllm_engines") or []:
            if not isinstance(engine, Mapping) or "port" not in engine:
                raise AnsibleFilterError(f"{host}: every entry of vllm_engines needs a port")
            add("vllm", _endpoint(address, int(engine["port"])))
    for host in gpu_hosts:
        variables = variables_of(host)
        if variables.get("gpu_exporter_enabled", True) in (False, "false", "False", "no"):
            continue
        add("gpu", _endpoint(_address(variables, host), _setting(variables, role_defaults.get("gpu_exporter", {}),
                                                                 "gpu_exporter_port")))
    for host in _hosts(groups, group_names["gateways"], required=True):
        variables = variables_of(host)
        gateway, worker = role_defaults.get("gateway", {}), role_defaults.get("worker", {})
        # The ops listener (/metrics), never the API port (roles/gateway).
        address = str(
            variables.get("gateway_ops_publish_address")
            or variables.get("gateway_publish_address")
            or _address(variables, host)
        )
        first = _setting(variables, gateway, "gateway_ops_port")
        for index in range(_setting(variables, gateway, "gateway_count")):
            add("gateway", _endpoint(address, first + index))
        address = str(variables.get("worker_publish_address") or _address(variables, host))
        first = _setting(variables, worker, "worker_metrics_port")
        for index in range(_setting(variables, worker, "worker_count")):
            add("worker", _endpoint(address, first + index))
    for host in _hosts(groups, group_names["redis"], required=True):
        variables = variables_of(host)
        add("redis", _endpoint(_address(variables, host),
                               _setting(variables, role_defaults.get("redis_exporter", {}), "redis_exporter_port")))
    for host in _hosts(groups, group_names["all"], required=True):
        variables = variables_of(host)
        add("node", _endpoint(_address(variables, host),
                              _setting(variables, role_defaults.get("node_exporter", {}), "node_exporter_port")))
    if scaler_url:
        add("scaler", _url_endpoint(str(scaler_url)))
    return targets


class FilterModule:
    """llmfleet monitoring filters."""

    def filters(self) -> dict[str, Any]:
        return {"scrape_targets": scrape_targets}
