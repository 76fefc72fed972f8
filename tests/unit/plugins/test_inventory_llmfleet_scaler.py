"""The llmfleet_scaler inventory plugin, through Ansible's own inventory manager (`ansible-inventory --list`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmfleet.paths import REPO_ROOT
from tests.tools import venv_tool

HOSTS = """\
all:
  children:
    gateways:
      hosts:
        gw1: {}
    gpu_nodes:
      hosts:
        gpu1: {}
    gpu_standby:
      hosts:
        gpu3: {}
        gpu4: {}
"""


def inventory_dir(tmp_path: Path, membership: dict[str, Any] | None, **options: object) -> Path:
    """An inventory directory as an operator keeps it: hosts.yml and the plugin's scaler.yml beside it."""
    directory = tmp_path / "inventory"
    directory.mkdir()
    (directory / "hosts.yml").write_text(HOSTS)
    state_file = tmp_path / "state" / "state.json"
    config = {"plugin": "llmfleet_scaler", "state_file": str(state_file), **options}
    (directory / "scaler.yml").write_text(json.dumps(config))
    if membership is not None:
        state_file.parent.mkdir()
        state_file.write_text(json.dumps({"version": 1, "membership": membership}))
    return directory


def ansible_inventory(directory: Path) -> subprocess.CompletedProcess[str]:
    # From the repository root, so its ansible.cfg (inventory_plugins = plugins/inventory) applies.
    return subprocess.run(
        [venv_tool("ansible-inventory"), "-i", str(directory), "--list"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def listed(directory: Path) -> dict[str, Any]:
    result = ansible_inventory(directory)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_a_scaled_out_host_moves_from_standby_into_gpu_nodes_once(tmp_path: Path) -> None:
    data = listed(inventory_dir(tmp_path, {"engine_hosts": ["gpu3"], "worker_counts": {"gw1": 4}}))
    assert data["gpu_nodes"]["hosts"] == ["gpu1", "gpu3"]
    assert data["gpu_standby"]["hosts"] == ["gpu4"]
    assert data["_meta"]["hostvars"]["gw1"]["worker_count"] == 4


def test_an_empty_membership_changes_nothing(tmp_path: Path) -> None:
    data = listed(inventory_dir(tmp_path, {"engine_hosts": [], "worker_counts": {}}))
    assert data["gpu_nodes"]["hosts"] == ["gpu1"]
    assert data["gpu_standby"]["hosts"] == ["gpu3", "gpu4"]
    assert "worker_count" not in data["_meta"]["hostvars"].get("gw1", {})


@pytest.mark.parametrize(
    ("membership", "options", "message"),
    [
        (None, {}, "does not exist: copy it from the monitoring host"),
        ({"engine_hosts": ["gpu9"]}, {}, "names gpu9, which no inventory source defines"),
        ({"worker_counts": {"gw1": "many"}}, {}, "not a whole number"),
    ],
)
def test_what_it_refuses(
    tmp_path: Path, membership: dict[str, Any] | None, options: dict[str, Any], message: str
) -> None:
    result = ansible_inventory(inventory_dir(tmp_path, membership, **options))
    # ansible.cfg sets any_unparsed_is_failed: a refused source fails the run, never only warns.
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split()), result.stderr


def test_missing_ok_reads_a_missing_file_as_nothing_scaled(tmp_path: Path) -> None:
    data = listed(inventory_dir(tmp_path, None, missing_ok=True))
    assert data["gpu_nodes"]["hosts"] == ["gpu1"]
