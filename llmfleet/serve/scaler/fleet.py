"""The fleet as the inventory describes it, read with `ansible-inventory --list` at each decision.

A child process, not Ansible's Python API in the service: it reads the same
ansible.cfg, plugins and inventory sources as the playbook runs, and keeps
Ansible's global state out of the service process. A decision costs one
inventory read (about a second); scaling alerts come minutes apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from llmfleet.errors import LlmfleetError
from llmfleet.serve.scaler.config import ScalerSettings
from llmfleet.serve.scaler.policy import Fleet
from llmfleet.serve.scaler.runner import plugin_source

# The worker role's defaults (roles/worker/defaults/main.yml): worker_count, worker_concurrency.
DEFAULT_WORKER_COUNT = 1
DEFAULT_WORKER_CONCURRENCY = 32


class FleetSource(Protocol):
    async def load(self) -> Fleet: ...


def group_hosts(inventory: Mapping[str, Any], group: str) -> tuple[str, ...] | None:
    """Hosts of `group` and its children, in inventory order, each once; None if there is no such group."""
    if group not in inventory:
        return None
    hosts: list[str] = []
    stack = [group]
    seen: set[str] = set()
    while stack:
        name = stack.pop(0)
        if name in seen:
            continue
        seen.add(name)
        entry = inventory.get(name) or {}
        hosts.extend(entry.get("hosts", []))
        stack.extend(entry.get("children", []))
    return tuple(dict.fromkeys(hosts))


def fleet_from_inventory(inventory: Mapping[str, Any], settings: ScalerSettings) -> Fleet:
    hostvars = inventory.get("_meta", {}).get("hostvars", {})
    gateways = group_hosts(inventory, settings.gateway_group)
    workers = concurrency = None
    if gateways is not None:
        workers = {host: int(hostvars.get(host, {}).get("worker_count", DEFAULT_WORKER_COUNT)) for host in gateways}
        # Only sizes a scale-out's step: a value that is no plain number (a template ansible-inventory leaves
        # unrendered) leaves it unknown, and the step falls back to the configured one.
        try:
            concurrency = {
                host: int(hostvars.get(host, {}).get("worker_concurrency", DEFAULT_WORKER_CONCURRENCY))
                for host in gateways
            }
        except (TypeError, ValueError):
            concurrency = None
    return Fleet(
        engine_hosts=group_hosts(inventory, settings.engine_group),
        standby_hosts=group_hosts(inventory, settings.standby_group),
        gateway_workers=workers,
        worker_concurrency=concurrency,
    )


class AnsibleInventory:
    def __init__(self, settings: ScalerSettings) -> None:
        self.settings = settings

    async def load(self) -> Fleet:
        settings = self.settings
        binary = Path(sys.executable).parent / "ansible-inventory"
        command = [str(binary) if binary.exists() else "ansible-inventory"]
        for source in [*settings.inventory, plugin_source(settings)]:
            command += ["-i", str(Path(source).resolve())]
        command.append("--list")
        env = {**os.environ, "ANSIBLE_CONFIG": str(settings.project_dir / "ansible.cfg")}
        process = await asyncio.create_subprocess_exec(
            *command,
            cwd=settings.project_dir,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await process.communicate()
        if process.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise LlmfleetError(f"ansible-inventory failed (exit {process.returncode}): {' '.join(tail)}")
        return fleet_from_inventory(json.loads(stdout), settings)
