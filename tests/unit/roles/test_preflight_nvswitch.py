"""The preflight role's NVSwitch check and its preflight_nvswitch_count fact, as written.

The check of tasks/evaluate.yml runs alone through ansible-playbook on localhost, given
the NVSwitches the nvidia_pci module found and what systemd says of Fabric Manager. The
real H200 (tests/unit/fixtures/real-h200-pci/, recorded there) has none: it must say so
and count 0. The four NVSwitches are the STAND-IN listing's (files/standins/pci-devices.yml,
not a real machine's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "preflight"
CHECK = "evaluate | Check for NVSwitches and Fabric Manager"
FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-pci"
REAL = json.loads((FIXTURES / "nvidia_pci.json").read_text())
# What the preflight and nvidia_driver roles decided on the H200 itself (checks.yml there, in check mode).
REAL_CHECKS = json.loads((FIXTURES / "checks.json").read_text())
STANDIN = [
    {key: device[key] for key in ("slot", "device", "class", "driver")}
    for device in yaml.safe_load((REPO_ROOT / "files" / "standins" / "pci-devices.yml").read_text())["devices"]
    if device["vendor"] == "0x10de" and device["class"].startswith("0x0680")
]


def _check(tmp_path: Path, nvswitches: list[dict[str, str]], fm: str | None, smi: str, marker: bool) -> dict[str, Any]:
    tasks = yaml.safe_load((ROLE / "tasks" / "evaluate.yml").read_text())
    check = [task for task in tasks if task["name"] == CHECK]
    assert len(check) == 1, "evaluate.yml no longer has the NVSwitch check: update this test"
    out = tmp_path / "out.json"
    keep = {
        "name": "Keep the result",
        "ansible.builtin.copy": {
            "content": "{{ {'results': __preflight_results, 'count': preflight_nvswitch_count} | to_json }}",
            "dest": str(out),
            "mode": "0644",
        },
    }
    registered = {
        "__preflight_results": [],
        "__preflight_pci_nvswitches": nvswitches,
        "__preflight_smi_state": smi,
        "__preflight_reboot_marker": {"stat": {"exists": marker}},
        "__preflight_driver_reboot_marker": "/var/lib/llmfleet/nvidia-driver-reboot-required",
    }
    if fm is not None:
        registered["__preflight_fabric_manager"] = {"rc": 0 if fm == "active" else 3, "stdout": fm}
    # Play vars, not -e: set_fact must be able to add to __preflight_results.
    play = [
        {"name": "NVSwitch check", "hosts": "all", "gather_facts": False, "vars": registered, "tasks": [*check, keep]}
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, playbook)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    kept: dict[str, Any] = json.loads(out.read_text())
    [entry] = kept["results"]
    entry["detail"] = " ".join(entry["detail"].split())
    return {"count": kept["count"], **entry}


def test_the_real_h200_has_no_nvswitch_and_needs_no_fabric_manager(tmp_path: Path) -> None:
    assert REAL["nvswitches"] == []
    result = _check(tmp_path, REAL["nvswitches"], fm=None, smi="ok", marker=False)
    assert result == {
        "count": 0,
        "check": "nvswitch",
        "status": "PASS",
        "detail": "none on the PCI bus: this host needs no NVIDIA Fabric Manager",
    }


def test_the_h200_itself_said_the_same_and_wanted_no_fabric_manager(tmp_path: Path) -> None:
    replayed = _check(tmp_path, REAL["nvswitches"], fm=None, smi="ok", marker=False)
    assert REAL_CHECKS["preflight_nvswitch_count"] == replayed["count"] == 0
    assert REAL_CHECKS["preflight_nvswitch_check"] == [{key: replayed[key] for key in ("check", "status", "detail")}]
    assert REAL_CHECKS["nvidia_pci"] == REAL
    assert REAL_CHECKS["nvidia_driver_fabric_manager_wanted"] is False
    assert REAL_CHECKS["nvidia_driver_preflight_refusal"] == ""
    assert REAL_CHECKS["persistence_mode"] == ["0, Enabled"]


def test_nvswitches_with_fabric_manager_running_pass(tmp_path: Path) -> None:
    result = _check(tmp_path, STANDIN, fm="active", smi="ok", marker=False)
    assert (result["count"], result["status"]) == (4, "PASS")
    assert result["detail"].startswith("4 NVSwitch(es) (0000:05:00.0 device 0x22a3, 0000:06:00.0 device 0x22a3,")
    assert result["detail"].endswith("nvidia-fabricmanager is active, as CUDA needs on an NVSwitch system")


def test_nvswitches_before_the_driver_is_installed_pass_with_what_comes(tmp_path: Path) -> None:
    result = _check(tmp_path, STANDIN, fm="inactive", smi="absent", marker=False)
    assert result["status"] == "PASS"
    assert "the nvidia_driver role installs it with the driver (nvidia_driver_fabric_manager: auto)" in result["detail"]


@pytest.mark.parametrize("marker", [False, True])
def test_nvswitches_with_fabric_manager_stopped_warn_with_what_to_do(tmp_path: Path, marker: bool) -> None:
    result = _check(tmp_path, STANDIN, fm="failed", smi="ok", marker=marker)
    assert result["status"] == "WARN"
    assert "nvidia-fabricmanager is failed, so CUDA fails on every GPU (error 802" in result["detail"]
    assert "starts only when its version equals the driver's exactly" in result["detail"]
    assert ("waiting for a reboot" in result["detail"]) == marker
