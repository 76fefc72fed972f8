"""Unit tests for plugins/filter/inventory.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

_SPEC = importlib.util.spec_from_file_location(
    "llmfleet_filter_inventory", Path(__file__).parents[4] / "plugins" / "filter" / "inventory.py"
)
assert _SPEC and _SPEC.loader
inventory = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(inventory)

REQUIRED = ["gpu_nodes", "gpu_standby", "gateways", "redis", "monitoring"]
RULES = {
    "required": REQUIRED,
    "non_empty": ["gpu_nodes", "gateways", "redis", "monitoring"],
    "single_host": ["redis"],
    "exclusive": [["gpu_nodes", "gpu_standby"]],
}
SOUND = {
    "all": ["gw1", "redis1", "mon1", "gpu1", "gpu2", "gpu3"],
    "ungrouped": [],
    "gateways": ["gw1"],
    "redis": ["redis1"],
    "monitoring": ["mon1"],
    "gpu_nodes": ["gpu1", "gpu2"],
    "gpu_standby": ["gpu3"],
}


def test_sound_inventory_has_no_problems() -> None:
    assert inventory.inventory_problems(SOUND, **RULES) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"gpu_nodes": None}, "group 'gpu_nodes' is missing"),
        ({"gpu_standby": None}, "group 'gpu_standby' is missing"),
        ({"gateways": [], "all": SOUND["all"][1:]}, "group 'gateways' has no hosts"),
        (
            {"redis": ["redis1", "redis2"], "all": [*SOUND["all"], "redis2"]},
            "group 'redis' must have exactly one host, has 2: redis1, redis2",
        ),
        ({"gpu_standby": ["gpu2"], "all": SOUND["all"][:-1]}, "host 'gpu2' is in both 'gpu_nodes' and 'gpu_standby'"),
        ({"all": [*SOUND["all"], "stray"], "ungrouped": ["stray"]}, "host 'stray' is in none of the groups"),
    ],
)
def test_broken_inventory_is_named(change: dict[str, list[str] | None], expected: str) -> None:
    groups = {**SOUND, **change}
    groups = {name: hosts for name, hosts in groups.items() if hosts is not None}
    problems = inventory.inventory_problems(groups, **RULES)
    # The named problem comes first; a missing group also orphans its hosts.
    assert problems, "a broken inventory must be reported"
    assert expected in problems[0]


def test_gpu_standby_may_be_empty() -> None:
    groups = {**SOUND, "gpu_standby": [], "all": SOUND["all"][:-1]}
    assert inventory.inventory_problems(groups, **RULES) == []


def test_rejects_what_is_not_the_groups_mapping() -> None:
    with pytest.raises(AnsibleFilterError, match="expects the `groups` mapping"):
        inventory.inventory_problems(["gw1"], **RULES)  # type: ignore[arg-type]


# --- inventory_examples: values an inventory copied from production.example still holds -------------------------

SECRETS = [
    {"name": "gateway_jwt_secret", "vault": "vault_gateway_jwt_secret", "groups": ["gateways"]},
    {"name": "vllm_hf_token", "vault": "vault_vllm_hf_token", "groups": ["gpu_nodes"], "optional": True},
    {"name": "grafana_admin_password", "vault": "vault_grafana_admin_password", "groups": ["monitoring"],
     "needed_if": "llmfleet_grafana"},
]
GROUPS = {"all": ["gw1", "mon1", "gpu1"], "gateways": ["gw1"], "monitoring": ["mon1"], "gpu_nodes": ["gpu1"]}


class _Undefined(dict[str, object]):
    """Host variables where reading `gateway_jwt_secret` fails, as its undefined vault_ variable makes Ansible fail."""

    def __getitem__(self, key: str) -> object:
        if key == "gateway_jwt_secret":
            raise KeyError("'vault_gateway_jwt_secret' is undefined")
        return super().__getitem__(key)


def _edited() -> dict[str, dict[str, object]]:
    """Host variables of a site that edited everything."""
    return {
        "gw1": {"ansible_host": "10.1.0.10", "gateway_jwt_secret": "a" * 64},
        "mon1": {"ansible_host": "10.1.0.30", "grafana_admin_password": "b" * 64,
                 "alertmanager_email_to": ["oncall@corp.lan"]},
        "gpu1": {"ansible_host": "10.1.0.41", "vllm_hf_token": "", "python_toolchain_wheelhouse": "/srv/wheels"},
    }


def _examples(hostvars: dict[str, dict[str, object]]) -> list[str]:
    return inventory.inventory_examples(hostvars, GROUPS, SECRETS, ["gpu_nodes"], ["monitoring"])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("192.0.2.10", ["192.0.2.10"]),
        ("198.51.100.7", ["198.51.100.7"]),
        ("http://203.0.113.5:9093/", ["203.0.113.5"]),
        (["10.0.0.1", {"peer": "192.0.2.255"}], ["192.0.2.255"]),
        ("2001:db8::10", ["2001:db8::10"]),
        ("10.77.0.10", []),
        ("192.0.20.1", []),
        ("1192.0.2.10", []),
        ("999.0.2.10", []),
        (8000, []),
    ],
)
def test_documentation_addresses(value: object, expected: list[str]) -> None:
    assert inventory.documentation_addresses(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ntp1.example.internal", ["ntp1.example.internal"]),
        (["smtp.example.internal:587", "oncall@example.com"], ["smtp.example.internal", "example.com"]),
        ("https://hooks.example.org/x", ["hooks.example.org"]),
        ("ntp1.corp.internal", []),
        ("myexample.com", []),
        ("example.internal.corp.lan", ["example.internal"]),
    ],
)
def test_example_names(value: object, expected: list[str]) -> None:
    assert inventory.example_names(value) == expected


@pytest.mark.parametrize(
    ("value", "placeholder"),
    [
        ("CHANGE-ME", True),
        ("CHANGE_ME", True),
        ("changeme", True),
        ("<change me>", True),
        ("example", True),
        ("TODO", True),
        ("", False),  # empty is judged by whether the secret is optional
        ("lab-only-not-a-secret-jwt-key-0c71a9e4d2b85f36", False),
        ("hf_llmfleet_lab_dummy_token_not_a_secret", False),
        (None, False),
    ],
)
def test_is_placeholder(value: object, placeholder: bool) -> None:
    assert inventory.is_placeholder(value) is placeholder


def test_an_edited_site_has_no_examples() -> None:
    assert _examples(_edited()) == []


@pytest.mark.parametrize(
    ("host", "change", "expected"),
    [
        ("gw1", {"ansible_host": "192.0.2.10"}, "documentation address (RFC 5737, no real host has one): gw1: "
                                                 "ansible_host=192.0.2.10"),
        ("gpu1", {"llmfleet_address": "198.51.100.41"}, "gpu1: llmfleet_address=198.51.100.41"),
        ("gw1", {"common_time_sync_servers": ["ntp1.example.internal"]},
         "example name (example.internal, RFC 2606): common_time_sync_servers = ntp1.example.internal (on gw1)"),
        ("gw1", {"gateway_jwt_secret": "CHANGE-ME"},
         "vault: vault_gateway_jwt_secret (for gateway_jwt_secret) is a placeholder or empty (on gw1)"),
        ("gw1", {"gateway_jwt_secret": ""},
         "vault: vault_gateway_jwt_secret (for gateway_jwt_secret) is a placeholder or empty (on gw1)"),
        ("gw1", {"vault_redis_worker_password": "changeme"}, "vault: vault_redis_worker_password is a placeholder"),
        ("gpu1", {"vllm_hf_token": "CHANGE-ME"}, "vault: vault_vllm_hf_token (for vllm_hf_token) is a placeholder"),
        ("gpu1", {"python_toolchain_wheelhouse": ""},
         "package index: python_toolchain_index_url and python_toolchain_wheelhouse are both empty on gpu1"),
        ("mon1", {"alertmanager_email_to": []}, "alert receiver: Alertmanager's `operators` receiver has no "
                                                 "destination on mon1"),
    ],
)
def test_each_example_value_is_named(host: str, change: dict[str, object], expected: str) -> None:
    hostvars = _edited()
    hostvars[host] = {**hostvars[host], **change}
    problems = _examples(hostvars)
    assert len(problems) == 1 and expected in problems[0], problems


def test_a_missing_vault_variable_is_named_never_its_value() -> None:
    hostvars = _edited()
    hostvars["gw1"] = _Undefined(hostvars["gw1"])
    del hostvars["gpu1"]["vllm_hf_token"]
    assert _examples(hostvars) == [
        "vault: vault_gateway_jwt_secret (for gateway_jwt_secret) is not defined (needed on gw1)",
        "vault: vault_vllm_hf_token (for vllm_hf_token) is not defined (needed on gpu1)",
    ]


def test_a_secret_is_reported_by_name_only() -> None:
    # A chat webhook URL still on an example host: named, but no part of a
    # secret's value is printed once the secrets list names the variable.
    hostvars = _edited()
    hostvars["mon1"]["alertmanager_slack_api_url"] = "https://hooks.example.com/T0/SECRETPART"
    secrets = [*SECRETS, {"name": "alertmanager_slack_api_url", "vault": "vault_alertmanager_slack_api_url",
                          "groups": ["monitoring"], "optional": True}]
    problems = inventory.inventory_examples(hostvars, GROUPS, secrets, ["gpu_nodes"], ["monitoring"])
    assert problems == ["example name (example.internal, RFC 2606): alertmanager_slack_api_url (on mon1)"]


@pytest.mark.parametrize(
    ("hosts", "change", "examples"),
    [
        # The lab: no Grafana, so no Grafana password; no receiver, said on purpose.
        ("mon1", {"grafana_admin_password": "", "llmfleet_grafana": False}, 0),
        ("mon1", {"alertmanager_email_to": [], "alertmanager_allow_no_receiver": True}, 0),
        ("mon1", {"alertmanager_email_to": [], "alertmanager_slack_api_url": "https://chat.corp.lan/hook"}, 0),
        ("gpu1", {"python_toolchain_wheelhouse": "", "python_toolchain_index_url": "https://pypi.corp.lan/cu121"}, 0),
        ("mon1", {"grafana_admin_password": "", "llmfleet_grafana": True}, 1),
    ],
)
def test_what_a_site_may_leave_empty(hosts: str, change: dict[str, object], examples: int) -> None:
    hostvars = _edited()
    hostvars[hosts] = {**hostvars[hosts], **change}
    assert len(_examples(hostvars)) == examples, _examples(hostvars)


@pytest.mark.parametrize(
    ("hostvars", "groups", "secrets"),
    [
        (["gw1"], GROUPS, SECRETS),
        ({}, ["gw1"], SECRETS),
        ({}, GROUPS, "gateway_jwt_secret"),
        ({}, GROUPS, [{"name": "gateway_jwt_secret"}]),
    ],
)
def test_inventory_examples_refuses_bad_input(hostvars: object, groups: object, secrets: object) -> None:
    with pytest.raises(AnsibleFilterError):
        inventory.inventory_examples(hostvars, groups, secrets)


def test_the_filters_are_registered() -> None:
    filters = inventory.FilterModule().filters()
    assert filters["inventory_examples"] is inventory.inventory_examples
