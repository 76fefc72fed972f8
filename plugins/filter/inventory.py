"""Filters that check an inventory's shape before any host is touched."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jinja2
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



# Addresses set aside for documentation (RFC 5737, RFC 3849): no real host has
# one, so an inventory that still names one was never edited.
DOCUMENTATION_NETWORKS = tuple(
    ipaddress.ip_network(network) for network in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
)
_IPV4 = re.compile(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?![\d.])")
_IPV6 = re.compile(r"(?<![0-9A-Fa-f:])2001:0?db8:[0-9a-f:]*", re.IGNORECASE)
# Names reserved for examples (RFC 2606, RFC 6761), production.example's own
# `example.internal` among them.
_EXAMPLE_NAME = re.compile(
    r"(?<![A-Za-z0-9_.-])(?:[A-Za-z0-9_-]+\.)*example\.(?:internal|com|net|org)\b", re.IGNORECASE
)
# A secret that is still the example's: vault.yml.example's CHANGE-ME and its
# spellings, or a whole value that only says what should go there.
_PLACEHOLDER = re.compile(r"change[-_ ]?me", re.IGNORECASE)
_PLACEHOLDER_WORDS = {"example", "placeholder", "todo", "tbd", "fixme", "secret", "password", "xxx", "none", "null"}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def documentation_addresses(value: Any) -> list[str]:
    """The documentation addresses (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) in a value."""
    found: list[str] = []
    for text in _strings(value):
        for candidate in _IPV4.findall(text):
            try:
                address = ipaddress.ip_address(candidate)
            except ValueError:  # 999.1.1.1: not an address
                continue
            if any(address in network for network in DOCUMENTATION_NETWORKS) and candidate not in found:
                found.append(candidate)
        # 2001:db8::/32 is the prefix itself: any address written with it is one.
        found += [candidate for candidate in _IPV6.findall(text) if candidate not in found]
    return found


def example_names(value: Any) -> list[str]:
    """The example domain names (example.internal, example.com/.net/.org) in a value."""
    found: list[str] = []
    for text in _strings(value):
        for name in _EXAMPLE_NAME.findall(text):
            if name not in found:
                found.append(name)
    return found


def is_placeholder(value: Any) -> bool:
    """True for a secret that is still an example's placeholder (CHANGE-ME, changeme, 'example', ...)."""
    if not isinstance(value, str):
        return False
    text = value.strip().strip("<>{}[]'\"").strip()
    return bool(_PLACEHOLDER.search(text)) or text.lower() in _PLACEHOLDER_WORDS


_MISSING = object()


def _plain(value: Any) -> Any:
    """value with every nested item read, so that templating happens here; raises on an undefined part."""
    # Where Ansible templates a conditional (assert's `that`), an undefined
    # variable comes back as an Undefined marker instead of an exception.
    if isinstance(value, jinja2.Undefined):
        raise AnsibleFilterError("undefined")
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _read(variables: Mapping[str, Any], name: str) -> Any:
    """A host's variable, templated as Ansible templates it; _MISSING if unset or if it cannot be templated."""
    if name not in variables:
        return _MISSING
    try:
        # Ansible templates lazily: a list's items only when read, so read them all here.
        return _plain(variables[name])
    except Exception:  # an undefined vault_ or role variable behind it, a failing lookup
        return _MISSING


def _empty(value: Any) -> bool:
    return value is _MISSING or value is None or (isinstance(value, (str, list, tuple, Mapping)) and len(value) == 0)


def _hosts_in(groups: Mapping[str, Sequence[str]], names: Sequence[str]) -> list[str]:
    hosts: list[str] = []
    for name in names:
        hosts += [host for host in groups.get(name, []) if host not in hosts]
    return hosts


def _on(hosts: Sequence[str], every: Sequence[str]) -> str:
    if len(hosts) > 1 and list(hosts) == list(every):
        return f"every host ({len(hosts)})"
    return ", ".join(hosts)


def inventory_examples(
    hostvars: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, Sequence[str]],
    secrets: Sequence[Mapping[str, Any]],
    toolchain_groups: Sequence[str] = (),
    alert_groups: Sequence[str] = (),
) -> list[str]:
    """Every value of the inventory that is still an example, one line each; empty when there is none.

    hostvars: Ansible's `hostvars` (host -> its variables, templated on read).
    groups: Ansible's `groups`.
    secrets: the secrets the roles need, each {name, vault, groups, optional?, needed_if?}: `name` is the
      variable the roles read, `vault` the vault variable an inventory sets it from, `groups` the groups
      whose hosts need it. `optional: true` allows an empty value (not an undefined one); `needed_if`
      names a host variable that, when false, means the host does not need the secret.
    toolchain_groups: groups whose hosts run python_toolchain, which needs a package index or a wheelhouse.
    alert_groups: groups whose hosts run Alertmanager, whose operators receiver needs a destination.

    Only variable names and the example addresses and names found are reported, never a secret's value.
    """
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError(f"inventory_examples expects `hostvars`, got {type(hostvars).__name__}")
    if not isinstance(groups, Mapping):
        raise AnsibleFilterError(f"inventory_examples expects the `groups` mapping, got {type(groups).__name__}")
    if not isinstance(secrets, Sequence) or isinstance(secrets, str):
        raise AnsibleFilterError("inventory_examples expects `secrets` as a list of {name, vault, groups}")
    for secret in secrets:
        if not isinstance(secret, Mapping) or not {"name", "vault", "groups"} <= set(secret):
            raise AnsibleFilterError(f"inventory_examples: each secret needs name, vault and groups, got {secret!r}")
    every = list(groups.get("all", []))
    secret_names = {secret["name"] for secret in secrets} | {secret["vault"] for secret in secrets}
    problems: list[str] = []

    # Documentation addresses and example names, in any variable of any host.
    addresses: dict[str, list[str]] = {}
    names: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for host in every:
        variables = hostvars[host]
        for name in sorted(variables):
            value = _read(variables, name)
            if value is _MISSING:
                continue
            secret = name in secret_names or name.startswith("vault_")
            for address in documentation_addresses(value):
                addresses.setdefault(host, []).append(name if secret else f"{name}={address}")
            found = example_names(value)
            if found:
                names.setdefault((name, () if secret else tuple(found)), []).append(host)
    for host, where in addresses.items():
        problems.append(f"documentation address (RFC 5737, no real host has one): {host}: {', '.join(where)}")
    for (name, found), hosts in names.items():
        shown = f"{name} = {', '.join(found)}" if found else name
        problems.append(f"example name (example.internal, RFC 2606): {shown} (on {_on(hosts, every)})")

    # The vault: each secret the roles need, on each host that needs it.
    missing: dict[str, list[str]] = {}
    placeholders: dict[str, list[str]] = {}
    for secret in secrets:
        for host in _hosts_in(groups, secret["groups"]):
            variables = hostvars[host]
            needed_if = secret.get("needed_if")
            if needed_if and _read(variables, needed_if) in (False, "false", "False", "no"):
                continue
            value = _read(variables, secret["name"])
            label = f"{secret['vault']} (for {secret['name']})"
            if value is _MISSING:
                missing.setdefault(label, []).append(host)
            elif is_placeholder(value) or (_empty(value) and not secret.get("optional", False)):
                placeholders.setdefault(label, []).append(host)
    # A vault_ variable that holds a placeholder, whether or not a secret above reads it.
    for host in every:
        variables = hostvars[host]
        for name in sorted(variables):
            if name.startswith("vault_") and is_placeholder(_read(variables, name)):
                consumer = next((s["name"] for s in secrets if s["vault"] == name), None)
                label = f"{name} (for {consumer})" if consumer else name
                if host not in placeholders.setdefault(label, []):
                    placeholders[label].append(host)
    for label, hosts in missing.items():
        problems.append(f"vault: {label} is not defined (needed on {_on(hosts, every)})")
    for label, hosts in placeholders.items():
        problems.append(f"vault: {label} is a placeholder or empty (on {_on(hosts, every)})")

    # python_toolchain's packages: the stack's CUDA torch is on no default index.
    no_source = [
        host for host in _hosts_in(groups, toolchain_groups)
        if _empty(_read(hostvars[host], "python_toolchain_index_url"))
        and _empty(_read(hostvars[host], "python_toolchain_wheelhouse"))
    ]
    if no_source:
        problems.append(
            "package index: python_toolchain_index_url and python_toolchain_wheelhouse are both empty on "
            f"{_on(no_source, every)}: set one (group_vars/all/gpu.yml says how)"
        )

    # Alertmanager's operators receiver: mail or chat, or an explicit "none".
    no_receiver = [
        host for host in _hosts_in(groups, alert_groups)
        if _read(hostvars[host], "alertmanager_allow_no_receiver") not in (True, "true", "True", "yes")
        and _empty(_read(hostvars[host], "alertmanager_email_to"))
        and _empty(_read(hostvars[host], "alertmanager_slack_api_url"))
    ]
    if no_receiver:
        problems.append(
            f"alert receiver: Alertmanager's `operators` receiver has no destination on {_on(no_receiver, every)}: "
            "set alertmanager_email_to (and its smarthost) or vault_alertmanager_slack_api_url, or "
            "alertmanager_allow_no_receiver: true to send operators' alerts nowhere on purpose"
        )
    return problems


class FilterModule:
    """llmfleet inventory filters."""

    def filters(self) -> dict[str, Any]:
        return {"inventory_problems": inventory_problems, "inventory_examples": inventory_examples}
