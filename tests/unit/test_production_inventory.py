"""inventories/production.example converges as far as Ansible can tell without a host.

A site copies production.example, fills in its vault from vault.yml.example and
runs site.yml. Before any host is reached, Ansible checks every role's inputs
against its meta/argument_specs.yml; a required variable only the lab sets, or
a CHANGE-ME left in a default, stops a real run there. These tests do what that
check does, for every play of site.yml, every role in it (with the variables
the playbook's `roles:` entries pass) and every host of production.example,
using Ansible's own inventory, variable precedence and templating, and the
facts of an Ubuntu 22.04 x86_64 host (the distribution the example's stack,
mission-cu121, is published for), since no host is contacted.

They also hold the example vault to what a site needs from it: every `vault_`
variable the inventories and roles name, each with how to make its value, and
its placeholders refused by playbooks/inventory_check.yml.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

# Facts live in memory only: the project's JSON fact cache (ansible.cfg) must
# neither feed these tests nor receive their made-up facts.
os.environ["ANSIBLE_CACHE_PLUGIN"] = "memory"
os.environ["ANSIBLE_CONFIG"] = str(REPO_ROOT / "ansible.cfg")

from ansible import context
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.collections import ImmutableDict

EXAMPLE = REPO_ROOT / "inventories" / "production.example"
VAULT_EXAMPLE = EXAMPLE / "group_vars" / "all" / "vault.yml.example"
PLACEHOLDER = re.compile(r"change[-_]?me", re.IGNORECASE)
VAULT_NAME = re.compile(r"\bvault_[a-z0-9_]+\b")

# What gathering would report on a bare Ubuntu 22.04 GPU host; only what the
# roles' defaults read before their own tasks run.
UBUNTU_2204_FACTS: dict[str, Any] = {
    "distribution": "Ubuntu",
    "distribution_version": "22.04",
    "distribution_major_version": "22",
    "distribution_release": "jammy",
    "os_family": "Debian",
    "architecture": "x86_64",
    "kernel": "5.15.0-125-generic",
    "memtotal_mb": 515000,
    "processor_vcpus": 64,
    "service_mgr": "systemd",
    "virtualization_role": "host",
    "virtualization_type": "kvm",
}


def _filled_vault_text() -> str:
    """vault.yml as a site makes it: every placeholder replaced by a fresh value."""
    return PLACEHOLDER.sub(lambda _match: secrets.token_hex(32), VAULT_EXAMPLE.read_text())


def _site(tmp_path: Path, vault_text: str) -> Path:
    """A copy of production.example with group_vars/all/vault.yml written from vault_text."""
    site = tmp_path / "mysite"
    shutil.copytree(EXAMPLE, site)
    (site / "group_vars" / "all" / "vault.yml").write_text(vault_text)
    return site


def _walk(blocks: list[Any]) -> Iterator[Any]:
    for block in blocks:
        for task in block.block + block.rescue + block.always:
            if hasattr(task, "block"):
                yield from _walk([task])
            else:
                yield task


def _placeholders(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, str):
        if PLACEHOLDER.search(value):
            yield f"{path} = {value!r}"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _placeholders(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _placeholders(item, f"{path}[{index}]")


def argument_problems(inventory_dir: Path) -> list[str]:
    """Every role's argument_specs checked against every host's variables, as Ansible checks them."""
    context.CLIARGS = ImmutableDict({"tags": [], "skip_tags": [], "check": False})
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook import Playbook
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    init_plugin_loader()
    loader = DataLoader()
    loader.set_basedir(str(REPO_ROOT / "playbooks"))
    inventory = InventoryManager(loader=loader, sources=[str(inventory_dir)])
    variables = VariableManager(loader=loader, inventory=inventory)
    # As the task queue manager does before a run: `hostvars` for the defaults
    # that read other hosts' variables (the workers' engines, Redis's address).
    variables._hostvars = HostVars(inventory=inventory, variable_manager=variables, loader=loader)
    playbook = Playbook.load(str(REPO_ROOT / "playbooks" / "site.yml"), variable_manager=variables, loader=loader)
    problems: list[str] = []
    checked = 0
    for play in playbook.get_plays():
        pattern = Templar(loader=loader, variables=variables.get_vars(play=play)).template(play.hosts)
        hosts = inventory.get_hosts(pattern)
        for task in _walk(play.compile()):
            if not task.action.endswith("validate_argument_spec") or task._role is None:
                continue
            role = task._role.get_name()
            spec = task.args["argument_spec"]
            for host in hosts:
                task_vars = variables.get_vars(play=play, host=host, task=task, include_hostvars=True)
                facts = UBUNTU_2204_FACTS | {"default_ipv4": {"address": str(host.vars.get("ansible_host", ""))}}
                task_vars["ansible_facts"] = facts
                task_vars.update({f"ansible_{key}": value for key, value in facts.items()})
                templar = Templar(loader=loader, variables=task_vars)
                where = f"{play.get_name()} / {role} / {host.name}"
                try:
                    given = templar.template({name: task_vars[name] for name in spec if name in task_vars})
                    given |= templar.template(task.args.get("provided_arguments") or {})
                except Exception as error:  # any templating failure is a run that stops here
                    problems.append(f"{where}: {type(error).__name__}: {error}")
                    continue
                checked += 1
                result = ArgumentSpecValidator(spec).validate(given, validate_role_argument_spec=True)
                problems += [f"{where}: {message}" for message in result.error_messages]
                for name, value in given.items():
                    problems += [f"{where}: placeholder {found}" for found in _placeholders(value, name)]
    assert checked > 0, "no role's argument_specs was checked: site.yml or the inventory did not load"
    return problems


def test_every_role_accepts_every_production_host(tmp_path: Path) -> None:
    problems = argument_problems(_site(tmp_path, _filled_vault_text()))
    assert not problems, "production.example would stop at argument validation:\n" + "\n".join(problems)


def test_the_check_finds_a_missing_required_variable(tmp_path: Path) -> None:
    # The same check, on a site whose vault lacks a value the roles need: it
    # must fail, naming the variable, or the test above proves nothing.
    vault = yaml.safe_load(_filled_vault_text())
    del vault["vault_redis_worker_password"]
    problems = argument_problems(_site(tmp_path, yaml.safe_dump(vault)))
    assert any("vault_redis_worker_password" in problem for problem in problems), problems


def test_the_check_finds_a_placeholder(tmp_path: Path) -> None:
    site = _site(tmp_path, _filled_vault_text())
    (site / "host_vars").mkdir()
    (site / "host_vars" / "gw-01.yml").write_text(
        "---\ngateway_count: 1\nworker_concurrency: 16\ngateway_image: llmfleet/service:CHANGE-ME\n"
    )
    problems = argument_problems(site)
    assert any("placeholder gateway_image" in problem and "gw-01" in problem for problem in problems), problems


def _vault_names_used() -> set[str]:
    """vault_ variables the shipped inventories and the roles' messages name."""
    names: set[str] = set()
    for path in [*(REPO_ROOT / "inventories").rglob("*.yml"), *(REPO_ROOT / "roles").rglob("*.yml")]:
        names |= set(VAULT_NAME.findall(path.read_text()))
    # Ansible's word for the vault's own password (a file a role may keep), not a value in it.
    return names - {"vault_password"}


def test_the_example_vault_has_every_vault_variable() -> None:
    example = yaml.safe_load(VAULT_EXAMPLE.read_text())
    missing = _vault_names_used() - set(example)
    assert not missing, f"vault.yml.example lacks {sorted(missing)}, which inventories or roles use"


def test_the_example_vault_says_how_to_make_each_value() -> None:
    # Each variable is preceded by a comment block that says how to generate it.
    lines = VAULT_EXAMPLE.read_text().splitlines()
    for index, line in enumerate(lines):
        if VAULT_NAME.match(line):
            comment = []
            for previous in reversed(lines[:index]):
                if not previous.startswith("#"):
                    break
                comment.append(previous)
            assert comment, f"vault.yml.example: no comment before {line.split(':')[0]}"
            assert re.search(r"openssl rand|Hugging Face|empty|same value as", " ".join(comment)), (
                f"vault.yml.example: the comment before {line.split(':')[0]} does not say how to make the value"
            )


def _inventory_check(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(site), "playbooks/inventory_check.yml"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_inventory_check_refuses_the_example_vault_as_shipped(tmp_path: Path) -> None:
    result = _inventory_check(_site(tmp_path, VAULT_EXAMPLE.read_text()))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "vault_gateway_jwt_secret" in output and "openssl rand" in output, output


def test_the_inventory_check_passes_a_filled_vault(tmp_path: Path) -> None:
    # The vault filled in, and the other example values the check refuses
    # (tests/unit/test_inventory_check.py) edited as a site edits them.
    site = _site(tmp_path, _filled_vault_text())
    for path, old, new in [
        ("hosts.yml", "192.0.2.", "10.20.0."),
        ("group_vars/all/common.yml", "example.internal", "corp.lan"),
        ("group_vars/all/gpu.yml", 'python_toolchain_index_url: ""', "python_toolchain_index_url: https://pypi.corp.lan"),
    ]:
        (site / path).write_text((site / path).read_text().replace(old, new))
    with (site / "group_vars" / "monitoring.yml").open("a") as monitoring:
        monitoring.write("alertmanager_email_to: [oncall@corp.lan]\n")
    result = _inventory_check(site)
    assert result.returncode == 0, result.stdout + result.stderr


# A name part that marks a secret: password(s), passwd, secret(s), token(s),
# key(s), credential(s), or a chat webhook URL (it carries its own credential).
SECRET_OPTION = re.compile(r"(^|_)(passwords?|passwd|secrets?|tokens?|keys?|credentials?|slack_api_url)(_|$)")
# Options whose names look secret but hold public values, each with why.
NOT_SECRET = {
    # The URL of a repository's public signing key.
    "cuda_repository_key_url",
    "nvidia_driver_repository_key_url",
    "nvidia_container_toolkit_repository_key_url",
    # sysctl names, not values.
    "kernel_tuning_container_applied_keys",
}


def _secret_options(options: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every option and suboption (at any depth) whose name looks secret, with its spec."""
    for name, option in (options or {}).items():
        if SECRET_OPTION.search(name) and name not in NOT_SECRET:
            yield f"{where}{name}", option
        yield from _secret_options(option.get("options") or {}, f"{where}{name}.")


@pytest.mark.parametrize(
    "specs", sorted((REPO_ROOT / "roles").glob("*/meta/argument_specs.yml")), ids=lambda p: p.parts[-3]
)
def test_every_secret_option_is_no_log(specs: Path) -> None:
    # Ansible then masks the value wherever it would print the role's
    # arguments. Every entry point, every suboption.
    entries = yaml.safe_load(specs.read_text())["argument_specs"]
    unmasked = [
        name
        for entry, spec in entries.items()
        for name, option in _secret_options(spec.get("options") or {}, f"{entry}: ")
        if option.get("no_log") is not True
    ]
    assert not unmasked, f"{specs.parts[-3]}: secret options without no_log: true: {unmasked}"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("scaler_ssh_private_key", True),
        ("vllm_hf_token", True),
        ("redis_worker_password", True),
        ("gateway_jwt_secret", True),
        ("gateway_jwt_previous_secrets", True),
        ("vllm_api_keys", True),
        ("alertmanager_slack_api_url", True),
        ("vllm_tokenizer", False),
        ("gateway_keyring_dir", False),
        ("cuda_repository_key_url", False),
    ],
)
def test_the_secret_name_rule(name: str, secret: bool) -> None:
    # The rule above, on names it must and must not flag: a rule that flags
    # nothing would pass every role.
    found = [found for found, _ in _secret_options({name: {}}, "")]
    assert found == ([name] if secret else []), found


def test_the_not_secret_list_names_real_options() -> None:
    # A stale entry would silently exempt a future secret of the same name.
    names = {
        name
        for specs in (REPO_ROOT / "roles").glob("*/meta/argument_specs.yml")
        for spec in yaml.safe_load(specs.read_text())["argument_specs"].values()
        for name in spec.get("options") or {}
    }
    assert not NOT_SECRET - names, sorted(NOT_SECRET - names)


STACKS = yaml.safe_load((REPO_ROOT / "playbooks" / "vars" / "stacks.yml").read_text())["gpu_stacks"]


@pytest.mark.parametrize("name", sorted(STACKS))
def test_each_stack_installs_a_driver_it_accepts(name: str) -> None:
    # driver.version is nvidia_driver_version's default: the role refuses one
    # off the branch or below the floor, so the table must not ship one.
    driver = STACKS[name]["driver"]
    version = tuple(int(part) for part in driver["version"].split("."))
    assert driver["version"].split(".")[0] == driver["branch"], driver
    assert version >= tuple(int(part) for part in driver["min_version"].split(".")), driver
