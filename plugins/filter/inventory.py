"""Filters that check an inventory's shape before any host is touched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError


def inventory_problems(
    groups: Mapping[str, Sequence[str]],
    required: Sequence[str],
    non_empty: Sequence[str] = (),
    single_host: Sequence[str] = (),
    exclusive: Sequence[Sequence[str]] = (),
) -> list[str]:
    """Return one actionable message per problem; an empty list means the inventory is sound.

    groups: Ansible's `groups` magic variable (group name -> host names).
    required: groups that must be defined, even if empty.
    non_empty: groups that need at least one host.
    single_host: groups that need exactly one host.
    exclusive: sets of groups no host may belong to more than one of.
    Every host must also belong to at least one required group, or site.yml
    would silently leave it unconfigured.
    """
    if not isinstance(groups, Mapping):
        raise AnsibleFilterError(f"inventory_problems expects the `groups` mapping, got {type(groups).__name__}")
    problems = [
        f"group '{name}' is missing from the inventory: add it (it may be empty: `{name}: {{hosts: {{}}}}`)"
        for name in required
        if name not in groups
    ]
    for name in non_empty:
        if name in groups and not groups[name]:
            problems.append(f"group '{name}' has no hosts: add at least one")
    for name in single_host:
        hosts = list(groups.get(name, []))
        if len(hosts) > 1:
            problems.append(f"group '{name}' must have exactly one host, has {len(hosts)}: {', '.join(hosts)}")
    for names in exclusive:
        seen: dict[str, str] = {}
        for name in names:
            for host in groups.get(name, []):
                if host in seen:
                    problems.append(f"host '{host}' is in both '{seen[host]}' and '{name}': keep it in one of them")
                else:
                    seen[host] = name
    member_of_role = {host for name in required for host in groups.get(name, [])}
    for host in groups.get("all", []):
        if host not in member_of_role:
            problems.append(f"host '{host}' is in none of the groups {', '.join(required)}: add it to one or remove it")
    return problems


class FilterModule:
    """llmfleet inventory filters."""

    def filters(self) -> dict[str, Any]:
        return {"inventory_problems": inventory_problems}
