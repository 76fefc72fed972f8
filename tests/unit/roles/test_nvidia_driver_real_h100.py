"""The nvidia_driver role's host checks, replayed on what the real H100 answered.

tests/unit/fixtures/real-h100-driver/ holds a run of its driver_checks.yml on the lent
H100 (check mode, local connection): the preflight, pending_kernel and persistence task
files as written, and what they decided (driver_checks.json). Here the same playbook
runs again on localhost, through the role's current task files, with the H100's readings
put back where the tasks look for them:

- the facts: Ubuntu 24.04, virtualization docker/guest (driver_checks.json), the running
  kernel (driver_checks.txt);
- the PCI bus: a sysfs tree holding the GPU the nvidia_pci module found there, read by the
  project's read_nvidia_pci through a FAKE nvidia_pci module (the real one has no path
  option; it would read this machine's bus);
- /boot, empty as `ls /boot` printed it, and no /lib/modules;
- nvidia-smi: a FAKE printing the persistence modes the role's query got there, and
  systemctl: a FAKE that is missing, as it was there.

The decisions it writes must be the recorded ones, key for key, so the test fails when the
code decides otherwise on the same readings. It cannot catch what the H100 did not record:
its whole PCI bus (only the NVIDIA devices the module kept), the driver it ran (the pin
checked here is the stack's), and the driver_origin.yml checks, which preflight.yml gained
after the recording (given a FAKE dpkg-query that finds no precompiled modules, and no
.run installer or DGX OS files, as STAND-INs, not readings).
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
REAL = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h100-driver"
RECORDED: dict[str, Any] = json.loads((REAL / "driver_checks.json").read_text())
RECORDED_LOG = (REAL / "driver_checks.txt").read_text()
PLAY: list[dict[str, Any]] = yaml.safe_load((REAL / "driver_checks.yml").read_text())
# The driver the H100 ran was passed to the play but not recorded: the stack's pin stands in.
STACKS = yaml.safe_load((REPO_ROOT / "playbooks" / "vars" / "stacks.yml").read_text())
DRIVER = STACKS["gpu_stacks"]["current-cu128"]["driver"]
SMI_QUERY = "--query-gpu=index,persistence_mode --format=csv,noheader"
PERSISTENT = "Persistence mode is Enabled on all 1 GPU(s)."


def _host() -> dict[str, Any]:
    """What driver_checks.txt recorded before the play ran: date, uname -r, nvidia-smi, systemctl, ls."""
    preamble = RECORDED_LOG.split("\nPLAY [", 1)[0].splitlines()
    _date, kernel, header, gpu, systemctl, modules = [line for line in preamble if line]
    assert header == "index, name, persistence_mode, pci.bus_id"
    index, name, mode, bus_id = (field.strip() for field in gpu.split(","))
    # Nothing between the systemctl and /lib/modules errors: `ls /boot` listed nothing.
    assert systemctl.endswith("systemctl: command not found")
    assert modules == "ls: cannot access '/lib/modules': No such file or directory"
    return {"kernel": kernel, "index": index, "name": name, "mode": mode, "bus_id": bus_id}


def _replay(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    modes: list[str],
    nvidia_devices: list[dict[str, str]],
    boot_kernels: tuple[str, ...] = (),
) -> tuple[dict[str, Any], str]:
    """Run the recorded play on the given readings: the driver_checks.json it writes, and its output."""
    host = _host()
    distribution, version = RECORDED["distribution"].split()
    virtualization_type, virtualization_role = RECORDED["virtualization"].split("/")
    facts = {
        "distribution": distribution,
        "distribution_version": version,
        "distribution_major_version": version.split(".")[0],
        "os_family": "Debian",
        "kernel": host["kernel"],
        "virtualization_type": virtualization_type,
        "virtualization_role": virtualization_role,
    }

    # The PCI bus, as sysfs shows it: the NVIDIA devices the module kept (vendor 0x10de).
    sysfs = tmp_path / "sys-bus-pci-devices"
    sysfs.mkdir()
    for device in nvidia_devices:
        slot = sysfs / device["slot"]
        slot.mkdir()
        for key, value in (("vendor", "0x10de"), ("device", device["device"]), ("class", device["class"])):
            (slot / key).write_text(value + "\n")
        (slot / "driver").symlink_to(f"../../../bus/pci/drivers/{device['driver']}")
    library = tmp_path / "library"
    library.mkdir()
    (library / "nvidia_pci.py").write_text(f"""#!/usr/bin/python
# FAKE nvidia_pci: the project's read_nvidia_pci on the H100's PCI devices rebuilt under {sysfs}.
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.nvidia_pci import read_nvidia_pci

module = AnsibleModule(argument_spec={{}}, supports_check_mode=True)
module.exit_json(changed=False, **read_nvidia_pci({str(sysfs)!r}))
""")
    monkeypatch.setenv("ANSIBLE_LIBRARY", f"{library}:{REPO_ROOT / 'plugins' / 'modules'}")

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "modes.csv").write_text("".join(f"{line}\n" for line in modes))
    fakes = {
        "nvidia-smi": f"""# FAKE nvidia-smi: the persistence modes the role's query got on the H100.
[ "$*" = "{SMI_QUERY}" ] || {{ echo "FAKE nvidia-smi: $*" >&2; exit 2; }}
cat {tmp_path / "modes.csv"}""",
        # The H100's VM had no systemd.
        "systemctl": 'echo "systemctl: command not found" >&2; exit 127',
        # Not recorded there (driver_origin.yml came later): no precompiled modules, rc 1 as dpkg-query says it.
        "dpkg-query": 'echo "dpkg-query: no packages found matching $4" >&2; exit 1',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    boot = tmp_path / "boot"
    boot.mkdir()
    for kernel in boot_kernels:
        (boot / f"vmlinuz-{kernel}").write_text("FAKE kernel image\n")

    # The recorded play, except that the facts are the H100's, given, not this machine's, gathered.
    play = [{**PLAY[0], "gather_facts": False}]
    playbook = tmp_path / "driver_checks.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    absent = tmp_path / "absent"
    extra = {
        "ansible_facts": facts,
        "collect_out": str(tmp_path),
        "nvidia_driver_version": DRIVER["version"],
        "nvidia_driver_branch": DRIVER["branch"],
        "__nvidia_driver_boot_dir": str(boot),
        "__nvidia_driver_modules_dir": str(absent / "lib" / "modules"),
        "__nvidia_driver_run_installer_files": [
            str(absent / "usr/bin/nvidia-uninstall"),
            str(absent / "var/lib/nvidia/log"),
        ],
        "__nvidia_driver_dgx_release_file": str(absent / "etc" / "dgx-release"),
    }
    result = run_local_playbook(tmp_path, playbook, json.dumps(extra), check=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    replayed: dict[str, Any] = json.loads((tmp_path / "driver_checks.json").read_text())
    return replayed, output


def test_the_recorded_readings_are_of_one_h100() -> None:
    # The inputs replayed below, and how the nvidia-smi line, the PCI bus and the role's query agree.
    host = _host()
    assert (host["index"], host["name"], host["mode"]) == ("0", "NVIDIA H100 80GB HBM3", "Enabled")
    [gpu] = RECORDED["nvidia_pci"]["gpus"]
    # nvidia-smi prints a 32-bit PCI domain, sysfs a 16-bit one: the same GPU.
    assert host["bus_id"] == "0000" + gpu["slot"]
    assert gpu["device"] == "0x2330"  # H100 SXM5 80GB
    assert RECORDED["persistence"]["gpus"] == [f"{host['index']}, {host['mode']}"]
    assert RECORDED["kernel"]["running"] == host["kernel"]


def test_the_role_decides_on_the_h100s_readings_as_it_did_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replayed, output = _replay(tmp_path, monkeypatch, RECORDED["persistence"]["gpus"], RECORDED["nvidia_pci"]["gpus"])
    # What the README says the H100 decided, decided again by the current task files.
    assert len(replayed["nvidia_pci"]["gpus"]) == 1
    assert replayed["nvidia_pci"]["nvswitches"] == []
    assert replayed["preflight"] == {"passed": True, "fabric_manager_wanted": False}
    assert (replayed["kernel"]["next"], replayed["kernel"]["reasons"]) == ("", [])
    assert replayed["persistence"] == {"passed": True, "nvidia_smi_rc": 0, "gpus": ["0, Enabled"]}
    assert PERSISTENT in output and f"msg: {PERSISTENT}" in RECORDED_LOG
    # And the whole record, key for key, as the H100 wrote it.
    assert replayed == RECORDED


def test_the_replay_reads_the_replayed_readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same play on provoked readings decides otherwise: it reads the fakes, not this machine.
    nvswitch = {"slot": "0000:05:00.0", "device": "0x22a3", "class": "0x068000", "driver": "nvidia-nvswitch"}
    newer = "6.18.45-fc-v1252-gpu"
    replayed, _ = _replay(
        tmp_path,
        monkeypatch,
        ["0, Disabled"],
        [*RECORDED["nvidia_pci"]["gpus"], nvswitch],
        boot_kernels=(RECORDED["kernel"]["running"], newer),
    )
    assert replayed["nvidia_pci"]["nvswitches"] == [nvswitch]
    assert replayed["preflight"] == {"passed": True, "fabric_manager_wanted": True}
    assert replayed["kernel"]["next"] == newer
    assert replayed["kernel"]["reasons"][0].startswith(f"kernel {newer} is installed and boots next")
    assert replayed["persistence"]["passed"] is False
    assert "Persistence mode is not Enabled on GPU(s) 0 (Disabled)" in " ".join(replayed["persistence"]["msg"].split())


def test_the_recorded_play_waits_for_a_kernel_as_verify_yml_does() -> None:
    # driver_checks.yml gives pending_kernel.yml its condition itself; it must stay verify.yml's.
    verify = yaml.safe_load((ROLE / "tasks" / "verify.yml").read_text())
    imported = next(task for task in verify if task.get("ansible.builtin.import_tasks") == "pending_kernel.yml")
    block = next(task for task in PLAY[0]["tasks"] if task["name"] == "Look for a kernel waiting for a reboot")
    included = next(task for task in block["block"] if task["name"] == "Apply pending_kernel.yml")
    assert included["vars"] == imported["vars"]
