"""Filters behind the Alertmanager silences of planned maintenance (playbooks/tasks/maintenance_silence.yml).

A playbook that stops a host's services on purpose (a rolling restart, a driver
upgrade, a scale-in or scale-out) silences that host's alerts while it works.
Which alerts are the host's is read from the labels the prometheus role's
rules carry (roles/prometheus/vars/alerts.yml):

- almost every alert keeps Prometheus's `instance`, the scrape target's
  "address:port" (`[address]:port` for IPv6), where the address is the one the
  scrape_targets filter (monitoring.py) writes: the engines' vllm_publish_address,
  the workers' worker_publish_address, and for every exporter the host's
  llmfleet_address, else ansible_host, else its inventory name. EngineDown's
  second rule derives `instance` from the engine URL the workers call, the same
  vllm_publish_address;
- GPUMemoryHeldWithoutEngine has no `instance`, only `host`: the instance with
  its port cut off.

No target carries a label naming the host by itself, and Alertmanager's matchers
within one silence all have to match, so a host gets two silences: one on
`instance` (every address of the host, any port) and one on `host`. A run for
one job only (scaling workers) gets the first, with a `job` matcher as well.

    inventory_hostname | maintenance_silence_matchers(hostvars)
    hostvars[monitoring_host] | alertmanager_api_url
    silences | maintenance_silence_reusable(matchers)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ansible.errors import AnsibleFilterError

# Alertmanager role's default port (roles/alertmanager/defaults/main.yml), for an inventory that sets none.
ALERTMANAGER_DEFAULT_PORT = 9093
# Every silence the playbooks make is created by "llmfleet <playbook>".
CREATED_BY_PREFIX = "llmfleet "
# Listen addresses that mean "every address": Alertmanager is then called on loopback.
_ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")  # noqa: S104 (compared with, never bound)


def _first(variables: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = variables.get(key)
        if value:
            return str(value)
    return ""


def _host_variables(hostvars: Mapping[str, Any], host: str) -> Mapping[str, Any]:
    if host not in hostvars:
        raise AnsibleFilterError(f"host '{host}' is not in the inventory")
    variables: Mapping[str, Any] = hostvars[host]
    return variables


def _label_address(address: str) -> str:
    """The address as it shows in `instance` and `host`: IPv6 in brackets."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _alternatives(values: Sequence[str]) -> str:
    escaped = [re.escape(value) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _matcher(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value, "isRegex": True, "isEqual": True}


def maintenance_silence_addresses(host: str, hostvars: Mapping[str, Any]) -> list[str]:
    """Every address the host's scrape targets (and so its alerts) are named by, each once."""
    variables = _host_variables(hostvars, host)
    own = _first(variables, "llmfleet_address", "ansible_host") or host
    found = [own, _first(variables, "vllm_publish_address"), _first(variables, "worker_publish_address")]
    return list(dict.fromkeys(address for address in found if address))


def maintenance_silence_matchers(
    host: str, hostvars: Mapping[str, Any], jobs: Sequence[str] | None = None
) -> list[list[dict[str, Any]]]:
    """The matchers of each silence that covers the host's alerts, in Alertmanager API v2's form.

    jobs: only these scrape jobs' alerts (by `job`); empty or None: every alert of the host.
    Each list of matchers is sorted by label name, as Alertmanager returns them.
    """
    if isinstance(jobs, (str, bytes)):
        raise AnsibleFilterError("maintenance_silence_matchers: jobs must be a list of job names, e.g. ['worker']")
    addresses = [_label_address(address) for address in maintenance_silence_addresses(host, hostvars)]
    pattern = _alternatives(addresses)
    on_instance = [_matcher("instance", f"{pattern}:[0-9]+")]
    if jobs:
        on_instance.append(_matcher("job", _alternatives([str(job) for job in jobs])))
        return [sorted(on_instance, key=lambda matcher: matcher["name"])]
    return [on_instance, [_matcher("host", pattern)]]


def alertmanager_api_url(variables: Mapping[str, Any]) -> str:
    """Where Alertmanager's API v2 answers, called from the monitoring host itself (its hostvars).

    The alertmanager role listens on alertmanager_listen_address (default: the host's
    llmfleet_address, else its default route's address) and alertmanager_port; a route
    prefix comes from alertmanager_external_url's path, as Alertmanager derives it. An
    address that means "every address" is reached on loopback.
    """
    facts = variables.get("ansible_facts") or {}
    default_route = (facts.get("default_ipv4") or {}).get("address", "") if isinstance(facts, Mapping) else ""
    address = _first(variables, "alertmanager_listen_address", "llmfleet_address") or str(default_route or "")
    address = address or _first(variables, "ansible_host", "inventory_hostname")
    if not address:
        raise AnsibleFilterError("alertmanager_api_url: the monitoring host has no address to reach Alertmanager at")
    if address in _ANY_ADDRESS:
        address = "127.0.0.1"
    port = variables.get("alertmanager_port") or ALERTMANAGER_DEFAULT_PORT
    try:
        port = int(port)
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"alertmanager_port must be a whole number, not {port!r}") from error
    prefix = urlsplit(str(variables.get("alertmanager_external_url") or "")).path.rstrip("/")
    return f"http://{_label_address(address)}:{port}{prefix}/api/v2"


def _matcher_key(matchers: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, bool, bool]]:
    return sorted(
        (str(m.get("name")), str(m.get("value")), bool(m.get("isRegex", False)), bool(m.get("isEqual", True)))
        for m in matchers
    )


def maintenance_silence_reusable(silences: Any, matchers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The silence a playbook made earlier with exactly these matchers, still active or pending; {} if none.

    silences: Alertmanager's GET /api/v2/silences answer. A playbook that died before it
    could expire its silence left it behind; a new run updates that one (POST with its id)
    instead of stacking another on top.
    """
    if not isinstance(silences, Sequence) or isinstance(silences, (str, bytes)):
        raise AnsibleFilterError("maintenance_silence_reusable expects the list GET /api/v2/silences answers")
    wanted = _matcher_key(matchers)
    for silence in silences:
        if not isinstance(silence, Mapping):
            continue
        state = (silence.get("status") or {}).get("state")
        if (state in ("active", "pending") and str(silence.get("createdBy", "")).startswith(CREATED_BY_PREFIX)
                and _matcher_key(silence.get("matchers") or []) == wanted):
            return dict(silence)
    return {}


class FilterModule:
    """llmfleet maintenance silence filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "maintenance_silence_addresses": maintenance_silence_addresses,
            "maintenance_silence_matchers": maintenance_silence_matchers,
            "maintenance_silence_reusable": maintenance_silence_reusable,
            "alertmanager_api_url": alertmanager_api_url,
        }
