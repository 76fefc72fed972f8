"""The nvidia_driver role's checks of persistence mode and of NVIDIA Fabric Manager, as written.

Both run through ansible-playbook on localhost. persistence.yml runs whole, with a FAKE
nvidia-smi (replaying the real H200's reading, tests/unit/fixtures/real-h200-pci/, or a
GPU out of persistence mode) and a FAKE systemctl that prints how Ubuntu's unit starts
the daemon. For Fabric Manager, the check of fabric_manager_verify.yml runs alone, given
what its probes (systemctl, dpkg-query, journalctl, nvidia-smi) would have registered: the
message must name both versions when they differ, and a Fabric Manager that waits for the
reboot into its driver must pass. The Molecule scenario runs the same tasks on a container
with STAND-IN packages; these cases cover what a container cannot (the real H200's
reading, a pending reboot with another driver loaded).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "nvidia_driver"
REAL = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-pci"
FM_CHECK = "fabric_manager_verify | Check that Fabric Manager runs at the driver's version"
UBUNTU_EXECSTART = (
    "{ path=/usr/bin/nvidia-persistenced ; argv[]=/usr/bin/nvidia-persistenced --user nvidia-persistenced"
    " --no-persistence-mode --verbose ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ;"
    " code=(null) ; status=0/0 }"
)


def _fakes(tmp_path: Path, persistence_csv: str) -> Path:
    """FAKE nvidia-smi and systemctl for the persistence check; nothing of this machine is read."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "modes.csv").write_text(persistence_csv)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
# FAKE nvidia-smi: persistence modes from a file (the real H200's reading, or a provoked one).
[ "$*" = "--query-gpu=index,persistence_mode --format=csv,noheader" ] || {{ echo "FAKE: $*" >&2; exit 2; }}
cat {tmp_path / "modes.csv"}
""")
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"""#!/bin/sh
# FAKE systemctl: how Ubuntu's unit starts nvidia-persistenced.
[ "$*" = "show --property=ExecStart --value nvidia-persistenced" ] || {{ echo "FAKE: $*" >&2; exit 2; }}
echo '{UBUNTU_EXECSTART}'
""")
    for tool in (smi, systemctl):
        tool.chmod(0o755)
    return bin_dir


def _persistence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, csv: str, *extra_vars: str) -> tuple[bool, str]:
    monkeypatch.setenv("PATH", f"{_fakes(tmp_path, csv)}:{os.environ['PATH']}")
    play = [
        {
            "name": "Persistence mode",
            "hosts": "all",
            "gather_facts": False,
            "vars_files": [str(ROLE / "vars" / "main.yml")],
            "vars": {"nvidia_driver_persistenced": True},
            "tasks": [
                {
                    "name": "Check persistence mode",
                    "ansible.builtin.import_tasks": str(ROLE / "tasks" / "persistence.yml"),
                }
            ],
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, playbook, *extra_vars)
    return result.returncode == 0, result.stdout + result.stderr


def test_the_real_h200_in_persistence_mode_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reading = (REAL / "persistence-mode.csv").read_text()
    assert reading == "0, Enabled\n"
    passed, output = _persistence(tmp_path, monkeypatch, reading)
    assert passed, output[-3000:]
    assert "Persistence mode is Enabled on all 1 GPU(s)." in output


def test_gpus_out_of_persistence_mode_are_named_with_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passed, output = _persistence(tmp_path, monkeypatch, "0, Enabled\n1, Disabled\n2, Enabled\n3, [N/A]\n")
    assert not passed
    message = " ".join(output.split())
    assert "Persistence mode is not Enabled on GPU(s) 1 (Disabled), 3 ([N/A]) of localhost (4 GPU(s))" in message
    assert "--no-persistence-mode, as Ubuntu's nvidia-persistenced unit starts it" in message
    assert "/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose" in message
    assert "systemctl cat nvidia-persistenced" in message


def test_an_old_driver_loaded_until_a_pending_reboot_is_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The packages moved to 535.261.03; 535.247.01 stays loaded until the reboot, when the check runs.
    pending = {
        "nvidia_driver_version": "535.261.03",
        "__nvidia_driver_reboot_pending": True,
        "__nvidia_driver_smi": {"rc": 0, "stdout_lines": ["535.247.01"]},
    }
    passed, output = _persistence(tmp_path, monkeypatch, "0, Disabled\n", json.dumps(pending))
    assert passed, output[-3000:]
    assert "Persistence mode is not Enabled" not in output


# --- Fabric Manager -----------------------------------------------------------------------------------------


def _registered(fm: str | None, running: str | None, active: str, pending: bool) -> dict[str, Any]:
    """What fabric_manager_verify.yml's probes and verify.yml register, for one host state."""
    installed = {"nvidia-driver": "535.261.03-1", "nvidia-kernel-dkms": "535.261.03-1", "nvidia-smi": "535.261.03-1"}
    if fm:
        installed |= {"nvidia-fabricmanager-535": fm, "libnvidia-nscq-535": fm}
    return {
        "nvidia_driver_version": "535.261.03",
        "nvidia_driver_packages": ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi"],
        "nvidia_driver_fabric_manager_packages": ["nvidia-fabricmanager-535", "libnvidia-nscq-535"],
        "__nvidia_driver_fm_simulated": False,
        "__nvidia_driver_reboot_pending": pending,
        "__nvidia_driver_fm_versions": {"rc": 0, "stdout_lines": [f"{k} {v}" for k, v in installed.items()]},
        "__nvidia_driver_smi": {"rc": 0, "stdout_lines": [running]} if running else {"rc": 9, "stdout_lines": []},
        "__nvidia_driver_fm_state": {"changed": False},
        "__nvidia_driver_fm_active": {"rc": 0 if active == "active" else 3, "stdout": active},
        "__nvidia_driver_fm_log": {"stdout_lines": ["fabric manager log line"]},
    }


def _fm_check(tmp_path: Path, registered: dict[str, Any]) -> tuple[bool, str]:
    tasks = yaml.safe_load((ROLE / "tasks" / "fabric_manager_verify.yml").read_text())
    check = [task for task in tasks if task["name"] == FM_CHECK]
    assert len(check) == 1, "fabric_manager_verify.yml no longer has the check: update this test"
    play = [
        {
            "name": "Fabric Manager",
            "hosts": "all",
            "gather_facts": False,
            "vars_files": [str(ROLE / "vars" / "main.yml")],
            "tasks": check,
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, playbook, json.dumps(registered))
    return result.returncode == 0, " ".join((result.stdout + result.stderr).split())


def test_fabric_manager_running_with_its_driver_passes(tmp_path: Path) -> None:
    passed, output = _fm_check(tmp_path, _registered("535.261.03-1", "535.261.03", "active", pending=False))
    assert passed, output[-3000:]
    assert "NVIDIA Fabric Manager 535.261.03 runs, with driver 535.261.03." in output


def test_a_fabric_manager_of_another_version_is_refused_naming_both(tmp_path: Path) -> None:
    passed, output = _fm_check(tmp_path, _registered("535.274.02-1", "535.261.03", "failed", pending=False))
    assert not passed
    assert "NVIDIA Fabric Manager (nvidia-fabricmanager) is failed on localhost, so CUDA fails on every GPU" in output
    assert (
        "Versions: Fabric Manager 535.274.02 (nvidia-fabricmanager-535 535.274.02-1); running driver 535.261.03"
        in output
    )
    assert (
        "driver packages nvidia-driver 535.261.03-1, nvidia-kernel-dkms 535.261.03-1, nvidia-smi 535.261.03-1" in output
    )
    assert "VERSION MISMATCH: Fabric Manager 535.274.02 does not start with driver 535.261.03" in output
    assert "Its last log lines: fabric manager log line" in output


def test_a_failure_with_matching_versions_points_elsewhere(tmp_path: Path) -> None:
    passed, output = _fm_check(tmp_path, _registered("535.261.03-0ubuntu2", "535.261.03", "failed", pending=False))
    assert not passed
    assert "VERSION MISMATCH" not in output
    assert "The versions match, so the cause is elsewhere" in output


def test_fabric_manager_waits_for_the_reboot_into_its_driver(tmp_path: Path) -> None:
    # The packages moved to 535.261.03; the loaded driver is still the old one until the pending reboot.
    passed, output = _fm_check(tmp_path, _registered("535.261.03-1", "535.247.01", "failed", pending=True))
    assert passed, output[-3000:]
    assert "waits for the reboot into driver 535.261.03 (running: 535.247.01)" in output


def test_a_missing_fabric_manager_with_no_reboot_pending_fails(tmp_path: Path) -> None:
    passed, output = _fm_check(tmp_path, _registered(None, "535.261.03", "inactive", pending=False))
    assert not passed
    assert "Versions: Fabric Manager not installed (nvidia-fabricmanager-535 not installed)" in output
