"""Engines are published where the workers call them, on every production.example GPU host.

The vllm role publishes each engine on vllm_publish_address (a role default);
the workers get the engines' URLs from the engine_urls filter, which reads the
inventory's host variables, where role defaults are absent. On a multi-homed
host (a management and a serving network) the default route's address is not
necessarily the one the inventory names: the two must still agree. Here each
GPU host of production.example gets facts whose default route is on another
network than its llmfleet_address, and the role's default, templated by
Ansible, must equal the address the filter hands the workers.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

os.environ["ANSIBLE_CACHE_PLUGIN"] = "memory"
os.environ["ANSIBLE_CONFIG"] = str(REPO_ROOT / "ansible.cfg")

_SPEC = importlib.util.spec_from_file_location(
    "llmfleet_filter_serving_address", REPO_ROOT / "plugins" / "filter" / "serving.py"
)
assert _SPEC and _SPEC.loader
serving = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(serving)

EXAMPLE = REPO_ROOT / "inventories" / "production.example"
DEFAULT = yaml.safe_load((REPO_ROOT / "roles" / "vllm" / "defaults" / "main.yml").read_text())["vllm_publish_address"]
# The default route on a management network, not the one the inventory names.
MANAGEMENT = "198.51.100.77"


def _template(expression: str, variables: dict[str, Any]) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    # Read with yaml.safe_load, the default is plain text until marked as a
    # template, as Ansible marks a role's defaults.
    return str(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression)))


def _gpu_hosts() -> list[tuple[str, dict[str, Any]]]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(EXAMPLE)])
    manager = VariableManager(loader=loader, inventory=inventory)
    hosts = inventory.get_hosts("gpu_nodes:gpu_standby")
    return [(host.name, dict(manager.get_vars(host=host, include_hostvars=False))) for host in hosts]


GPU_HOSTS = _gpu_hosts()


def test_the_example_has_gpu_hosts() -> None:
    assert len(GPU_HOSTS) >= 2, GPU_HOSTS


@pytest.mark.parametrize(("name", "variables"), GPU_HOSTS, ids=[name for name, _ in GPU_HOSTS])
def test_engines_are_published_where_the_workers_call_them(name: str, variables: dict[str, Any]) -> None:
    published = _template(DEFAULT, variables | {"ansible_default_ipv4": {"address": MANAGEMENT}})
    workers_call = serving._address(variables, name)
    assert published == workers_call == variables["llmfleet_address"], (published, workers_call)
    assert published != MANAGEMENT


def test_without_llmfleet_address_the_default_route_is_used() -> None:
    # A host the inventory gives no llmfleet_address keeps the old behaviour.
    assert _template(DEFAULT, {"ansible_host": "192.0.2.9", "ansible_default_ipv4": {"address": MANAGEMENT}}) == (
        MANAGEMENT
    )
    assert _template(DEFAULT, {"ansible_host": "192.0.2.9"}) == "192.0.2.9"
