# Copyright: llmfleet contributors
# Apache-2.0
"""Inventory plugin: apply the scaler's state file, so a plain site.yml keeps what the scaler scaled."""

from __future__ import annotations

DOCUMENTATION = r"""
name: llmfleet_scaler
short_description: Apply the llmfleet scaler's membership to the inventory
description:
  - Reads the state file of the llmfleet scaler (C(llmfleet scaler serve), the C(scaler) role) and applies its
    C(membership) to the hosts the other inventory sources define.
  - Each standby host the scaler added as an engine host moves from O(standby_group) into O(engine_group), once.
  - Each gateway host the scaler changed the worker count of gets that count as the inventory host variable
    C(worker_count). It overrides C(group_vars), not C(host_vars) files, so set a gateway's base count in
    C(group_vars).
  - The hosts must already be in the inventory. Name the configuration file so it sorts after the other sources
    in the inventory directory (Ansible reads a directory in name order), for example C(scaler.yml) beside
    C(hosts.yml).
  - The file name must end in C(scaler.yml) or C(scaler.yaml).
options:
  plugin:
    description: The name of this plugin.
    required: true
    choices: [llmfleet_scaler]
  state_file:
    description: Path of the scaler's state file (C(state.json) in its state directory).
    required: true
    type: path
  engine_group:
    description: The group of engine hosts.
    type: str
    default: gpu_nodes
  standby_group:
    description: The group of standby hosts.
    type: str
    default: gpu_standby
  missing_ok:
    description:
      - Whether a missing state file means "nothing scaled yet". The default refuses it, so a controller without
        the file cannot run site.yml and undo a scale-out; copy the file from the monitoring host first.
    type: bool
    default: false
"""

EXAMPLES = r"""
# inventories/production/scaler.yml (sorts after hosts.yml)
plugin: llmfleet_scaler
state_file: /var/lib/llmfleet-scaler/state.json
"""

import json  # noqa: E402  (after DOCUMENTATION, as Ansible plugins are laid out)
from pathlib import Path  # noqa: E402

from ansible.errors import AnsibleParserError  # noqa: E402
from ansible.plugins.inventory import BaseInventoryPlugin  # noqa: E402


class InventoryModule(BaseInventoryPlugin):
    NAME = "llmfleet_scaler"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("scaler.yml", "scaler.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        state_file = self.get_option("state_file")
        engine_group = self.get_option("engine_group")
        standby_group = self.get_option("standby_group")
        membership = self._membership(state_file)
        if membership is None:
            return
        for host in membership.get("engine_hosts", []):
            self._known(host, state_file)
            self.inventory.add_group(engine_group)
            self.inventory.add_host(host, group=engine_group)
            if standby_group in self.inventory.groups:
                standby = self.inventory.groups[standby_group]
                if host in [member.name for member in standby.get_hosts()]:
                    standby.remove_host(self.inventory.hosts[host])
        for host, count in membership.get("worker_counts", {}).items():
            self._known(host, state_file)
            if not isinstance(count, int) or count < 0:
                raise AnsibleParserError(f"{state_file}: worker count of {host} is {count!r}, not a whole number")
            self.inventory.set_variable(host, "worker_count", count)

    def _membership(self, state_file):
        if not Path(state_file).exists():
            if self.get_option("missing_ok"):
                return None
            raise AnsibleParserError(
                f"the scaler's state file {state_file} does not exist: copy it from the monitoring host"
                " (a site run without it would undo scale-outs), or set missing_ok: true where nothing was scaled"
            )
        try:
            data = json.loads(Path(state_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise AnsibleParserError(f"cannot read the scaler's state file {state_file}: {error}") from error
        if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("membership"), dict):
            raise AnsibleParserError(f"{state_file} is not a scaler state file of version 1")
        return data["membership"]

    def _known(self, host, state_file):
        if host not in self.inventory.hosts:
            raise AnsibleParserError(
                f"{state_file} names {host}, which no inventory source defines; keep the host in the inventory"
                " (its standby group) and name this file so it sorts after the others"
            )
