"""The preflight role's NVSwitch check and its preflight_nvswitch_count fact, as written.

The role's tasks/evaluate.yml runs through ansible-playbook on localhost, given what its
probes found (tasks/probe.yml's registered results): a healthy host with the real H200's
GPU (tests/unit/fixtures/real-h200/gpu_facts.json), the NVSwitches the nvidia_pci module
found and what systemd says of Fabric Manager. Its nvswitch result and the count are kept.
The real H200 (tests/unit/fixtures/real-h200-pci/, recorded there) has none: it must say so
and count 0. The four NVSwitches are the STAND-IN listing's (files/standins/pci-devices.yml,
not a real machine's). The check's other branches: tests/unit/roles/test_preflight_checks.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

CHECK = "nvswitch"
FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-pci"
REAL = json.loads((FIXTURES / "nvidia_pci.json").read_text())
# What the preflight and nvidia_driver roles decided on the H200 itself (checks.yml there, in check mode).
REAL_CHECKS = json.loads((FIXTURES / "checks.json").read_text())
# What the gpu_facts module read on the real H200 through NVML, no process holding memory.
REAL_GPU_PROBE = json.loads((REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200" / "gpu_facts.json").read_text())[
    "nvml"
]
STANDIN = [
    {key: device[key] for key in ("slot", "device", "class", "driver")}
    for device in yaml.safe_load((REPO_ROOT / "files" / "standins" / "pci-devices.yml").read_text())["devices"]
    if device["vendor"] == "0x10de" and device["class"].startswith("0x0680")
]


def _probes(nvswitches: list[dict[str, str]], fm: str | None, smi: str, marker: bool) -> dict[str, Any]:
    """tasks/probe.yml's registered results on a healthy host with the real H200's GPU, with these NVSwitches,
    Fabric Manager state (None: not asked, as without NVSwitches), driver state and reboot marker."""
    gpu_probe = REAL_GPU_PROBE if smi == "ok" else {
        "changed": False, "state": smi, "msg": f"gpu_facts: the driver is {smi}", "gpus": [], "processes": []}
    fabric_manager = ({"changed": False, "skipped": True} if fm is None
                      else {"rc": 0 if fm == "active" else 3, "stdout": fm})
    return {
        # The facts the os check reads, as the H200's Ubuntu gives them (this machine's are not gathered).
        "ansible_facts": {"distribution": "Ubuntu", "distribution_version": "24.04",
                          "distribution_major_version": "24"},
        "__preflight_pci_probe": {"gpus": REAL["gpus"], "nvswitches": nvswitches},
        "__preflight_fabric_manager": fabric_manager,
        "__preflight_gpu_probe": gpu_probe,
        "__preflight_engine_containers": {"rc": 0, "stdout_lines": []},
        "__preflight_modules": {"content": base64.b64encode(b"nvidia 1 0 - Live 0x0\n").decode()},
        "__preflight_nvidia_module": {"stat": {"exists": smi != "absent"}},
        "__preflight_reboot_marker": {"stat": {"exists": marker}},
        "__preflight_df_probe": {"stdout_lines": ["/dev/shm\t/dev/shm\t8388608\t8388608"]},
        "__preflight_shm_limits": {"stdout_lines": ["18446744073692774399", "18446744073692774399", "4096"]},
        "__preflight_page_size": {"stdout": "4096"},
        "__preflight_secure_boot_probe": {
            "stdout": json.dumps({"state": "no-efi", "source": "none", "dkms_key": "absent"})
        },
        "preflight_disk_requirements": [],
    }


def _check(tmp_path: Path, nvswitches: list[dict[str, str]], fm: str | None, smi: str, marker: bool) -> dict[str, Any]:
    out = tmp_path / "out.json"
    evaluate = {
        "name": "Judge what the probes found",
        "ansible.builtin.include_role": {"name": "preflight", "tasks_from": "evaluate.yml"},
        "vars": _probes(nvswitches, fm, smi, marker),
    }
    keep = {
        "name": "Keep the result",
        "ansible.builtin.copy": {
            "content": "{{ {'results': __preflight_results, 'count': preflight_nvswitch_count} | to_json }}",
            "dest": str(out),
            "mode": "0644",
        },
    }
    play = [{"name": "NVSwitch check", "hosts": "all", "gather_facts": False, "tasks": [evaluate, keep]}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, playbook)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    kept: dict[str, Any] = json.loads(out.read_text())
    found = [entry for entry in kept["results"] if entry["check"] == CHECK]
    assert len(found) == 1, f"evaluate.yml no longer gives one {CHECK} result: update this test ({kept['results']})"
    [entry] = found
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
