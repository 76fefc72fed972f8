"""The lab's hosts, read from the lab inventory: one source of truth for
what `llmfleet lab up` creates and what Ansible then configures."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT

DEFAULT_INVENTORY = REPO_ROOT / "inventories" / "lab" / "hosts.yml"


@dataclass(frozen=True)
class LabHost:
    name: str  # inventory hostname, also the container's hostname
    container: str
    address: str
    groups: tuple[str, ...]
    # Hosts that run containers get their /var/lib/docker on a volume, so the
    # inner engine uses overlay2 instead of the slow vfs driver.
    docker_volume: str
    # True for hosts that get the STAND-IN NVIDIA package repository (GPU-less
    # stand-ins for the GPU hosts): the groups in all.vars.lab_standin_groups.
    standins: bool = False
    # True for a host whose /sys/bus/pci/devices is the STAND-IN PCI listing with
    # NVSwitches (llmfleet.lab.standin_pci): its host entry sets lab_standin_pci: true.
    standin_pci: bool = False


@dataclass(frozen=True)
class Lab:
    name: str
    network: str
    subnet: str
    hosts: tuple[LabHost, ...]
    # all.vars.ansible_user: the unprivileged user Ansible logs in as over SSH, then sudo (llmfleet.lab.ssh).
    ssh_user: str

    @property
    def label(self) -> str:
        """Label put on every container, network and volume `up` creates."""
        return f"llmfleet.lab={self.name}"


def load_lab(inventory: Path = DEFAULT_INVENTORY) -> Lab:
    try:
        data = yaml.safe_load(inventory.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise LlmfleetError(f"cannot read lab inventory {inventory}: {error}") from error
    top = data.get("all", {})
    top_vars: dict[str, Any] = top.get("vars", {})
    try:
        lab_name = str(top_vars["lab_name"])
        subnet = str(ipaddress.ip_network(top_vars["lab_subnet"]))
    except (KeyError, ValueError) as error:
        raise LlmfleetError(f"{inventory}: all.vars needs lab_name and a valid lab_subnet ({error})") from error
    ssh_user = str(top_vars.get("ansible_user") or "")
    if not ssh_user or ssh_user == "root":
        raise LlmfleetError(
            f"{inventory}: all.vars needs ansible_user, an unprivileged user (with ansible_become: true),"
            " as production logs in: the lab creates it on every host"
        )
    host_groups: dict[str, list[str]] = {}
    host_vars: dict[str, dict[str, Any]] = {}
    for group, body in (top.get("children") or {}).items():
        for host, hvars in ((body or {}).get("hosts") or {}).items():
            host_groups.setdefault(host, []).append(group)
            host_vars.setdefault(host, {}).update(hvars or {})
    standin_groups = set(top_vars.get("lab_standin_groups") or [])
    hosts = []
    for host, groups in host_groups.items():
        address = host_vars[host].get("lab_address")
        if address is None or ipaddress.ip_address(address) not in ipaddress.ip_network(subnet):
            raise LlmfleetError(f"{inventory}: host {host} needs lab_address inside {subnet}")
        container = f"{lab_name}-{host}"
        # Ansible logs in over SSH at the host's address; written out per host, not templated from
        # lab_address, so that a task delegated to this host never reads the delegating host's.
        if str(host_vars[host].get("ansible_host")) != str(address):
            raise LlmfleetError(f"{inventory}: host {host} needs ansible_host: {address} (its lab_address)")
        hosts.append(
            LabHost(
                host,
                container,
                str(address),
                tuple(groups),
                f"{container}-docker",
                standins=bool(standin_groups.intersection(groups)),
                standin_pci=host_vars[host].get("lab_standin_pci") is True,
            )
        )
    if not hosts:
        raise LlmfleetError(f"{inventory}: no hosts under all.children")
    return Lab(lab_name, f"{lab_name}-net", subnet, tuple(hosts), ssh_user)
