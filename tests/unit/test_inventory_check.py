"""playbooks/inventory_check.yml refuses an unedited inventory before any host is contacted.

Run against inventories/production.example as shipped (no vault, documentation
addresses, example names, no package index, no alert receiver), it must fail
in one message that names every example value, and no task may reach a host:
only localhost appears in the play recap. The example's addresses are never a
target: every run passes ProxyCommand=false, so any SSH attempt would fail at
once, on this machine, without a packet leaving it. The lab inventory, and the
lab tests' copy of it on another subnet, must pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.bench.provisioning import RECAP_LINE
from llmfleet.paths import REPO_ROOT

EXAMPLE = REPO_ROOT / "inventories" / "production.example"
PLAYBOOK = REPO_ROOT / "playbooks" / "inventory_check.yml"
NO_SSH = "ansible_ssh_common_args='-o ProxyCommand=false'"


def inventory_check(inventory: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """ansible-playbook inventory_check.yml, as site.yml's first play runs it, with the project's ansible.cfg."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOK),
         "-e", NO_SSH, *flags],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def recap_hosts(output: str) -> list[str]:
    return [match["host"] for match in RECAP_LINE.finditer(output)]


def _hosts(inventory: Path) -> dict[str, dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = {}
    for group in yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"].values():
        hosts |= group.get("hosts") or {}
    return hosts


@pytest.mark.parametrize("mode", [[], ["--check"]], ids=["run", "check-mode"])
def test_the_unedited_example_is_refused_naming_every_example_value(mode: list[str]) -> None:
    result = inventory_check(EXAMPLE, *mode)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # No task reached a host: the recap has localhost only, and nothing was unreachable.
    assert recap_hosts(output) == ["localhost"], output
    assert "UNREACHABLE" not in output, output
    # One failure, one message.
    assert output.count("fatal: [localhost]: FAILED!") == 1, output
    message = output[output.index("fatal: [localhost]: FAILED!"):]
    message = re.sub(r"\s+", " ", message)
    for host, variables in _hosts(EXAMPLE).items():
        assert f"{host}: ansible_host={variables['ansible_host']}, llmfleet_address=" in message, (host, message)
    assert "ntp1.example.internal" in message and "ntp2.example.internal" in message, message
    vault = yaml.safe_load((EXAMPLE / "group_vars" / "all" / "vault.yml.example").read_text())
    for name in vault:
        assert re.search(rf"vault: {name} \(for \w+\) is not defined", message), (name, message)
    assert "python_toolchain_index_url and python_toolchain_wheelhouse are both empty" in message, message
    assert "`operators` receiver has no destination on mon-01" in message, message


@pytest.mark.parametrize("mode", [[], ["--check"]], ids=["run", "check-mode"])
def test_the_lab_passes(mode: list[str]) -> None:
    result = inventory_check(REPO_ROOT / "inventories" / "lab", *mode)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert recap_hosts(output) == ["localhost"], output


def test_the_lab_tests_copy_passes(tmp_path: Path) -> None:
    # tests/lab/helpers.py's copy_lab_inventory: the lab renamed and moved to 10.78.0.0/24.
    from tests.lab.helpers import copy_lab_inventory

    copy = copy_lab_inventory(tmp_path / "lab")
    assert "10.78.0.10" in (copy / "hosts.yml").read_text()
    result = inventory_check(copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_edited_example_passes(tmp_path: Path) -> None:
    # Every value the message names, edited as a site would: the check then passes,
    # so each line of the message above is one the site can clear.
    site = tmp_path / "mysite"
    shutil.copytree(EXAMPLE, site)
    hosts = site / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("192.0.2.", "10.20.0."))
    common = site / "group_vars" / "all" / "common.yml"
    common.write_text(common.read_text().replace("example.internal", "corp.lan"))
    gpu = site / "group_vars" / "all" / "gpu.yml"
    gpu.write_text(gpu.read_text().replace('python_toolchain_index_url: ""',
                                           "python_toolchain_index_url: https://pypi.corp.lan/whl/cu121"))
    monitoring = site / "group_vars" / "monitoring.yml"
    monitoring.write_text(monitoring.read_text() + "alertmanager_email_to: [oncall@corp.lan]\n")
    vault = (site / "group_vars" / "all" / "vault.yml.example").read_text()
    (site / "group_vars" / "all" / "vault.yml").write_text(
        re.sub(r"CHANGE-ME", lambda _match: os.urandom(16).hex(), vault)
    )
    result = inventory_check(site)
    assert result.returncode == 0, result.stdout + result.stderr


# The playbook's list of secrets, held to the example vault and secrets.yml.
CHECK_VARS = yaml.safe_load(PLAYBOOK.read_text())[0]["vars"]


def test_the_check_knows_every_vault_variable() -> None:
    vault = yaml.safe_load((EXAMPLE / "group_vars" / "all" / "vault.yml.example").read_text())
    secrets = CHECK_VARS["__llmfleet_secrets"]
    assert {secret["vault"] for secret in secrets} == set(vault)
    # The values the example leaves empty are the ones a site may leave empty.
    assert {secret["vault"] for secret in secrets if secret.get("optional")} == {
        name for name, value in vault.items() if value == ""
    }


def test_the_check_reads_each_secret_from_its_vault_variable() -> None:
    wiring = yaml.safe_load((EXAMPLE / "group_vars" / "all" / "secrets.yml").read_text())
    for secret in CHECK_VARS["__llmfleet_secrets"]:
        assert wiring.get(secret["name"]) == "{{ " + secret["vault"] + " }}", secret
