"""plugins/module_utils/nvidia_pci.py: the NVSwitch detection of the preflight and nvidia_driver roles.

The sysfs trees here are built from two listings: the real H200's whole PCI bus, recorded on
the lent machine (tests/unit/fixtures/real-h200-pci/), which has no NVSwitch, and the
STAND-IN listing (files/standins/pci-devices.yml, not a real machine's) that the
nvidia_driver role's Molecule scenario mounts, with four NVSwitches.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmfleet.module_utils.nvidia_pci import read_nvidia_pci
from llmfleet.paths import REPO_ROOT
from tests.ansible_adhoc import run_adhoc

REAL = REPO_ROOT / "tests" / "unit" / "fixtures" / "real-h200-pci"
STANDIN = REPO_ROOT / "files" / "standins" / "pci-devices.yml"


def _tree(root: Path, devices: list[dict[str, str]]) -> Path:
    """A /sys/bus/pci/devices-like directory: one directory per slot, driver as a link."""
    root.mkdir()
    for device in devices:
        slot = root / device["slot"]
        slot.mkdir()
        for key in ("vendor", "device", "class"):
            (slot / key).write_text(device[key] + "\n")
        if device.get("driver", "none") != "none":
            (slot / "driver").symlink_to(f"../../../bus/pci/drivers/{device['driver']}")
    return root


def _real_devices() -> list[dict[str, str]]:
    lines = [line.split() for line in (REAL / "pci-devices.txt").read_text().splitlines() if not line.startswith("#")]
    return [dict(zip(("slot", "vendor", "device", "class", "driver"), fields, strict=True)) for fields in lines]


def test_the_real_h200_has_one_gpu_and_no_nvswitch(tmp_path: Path) -> None:
    found = read_nvidia_pci(str(_tree(tmp_path / "devices", _real_devices())))
    assert found == {
        "gpus": [{"slot": "0000:00:06.0", "device": "0x2335", "class": "0x030200", "driver": "nvidia"}],
        "nvswitches": [],
    }
    # What the same code found on the machine itself.
    assert found == json.loads((REAL / "nvidia_pci.json").read_text())


def test_the_stand_in_listing_has_four_nvswitches_and_two_gpus(tmp_path: Path) -> None:
    devices = yaml.safe_load(STANDIN.read_text())["devices"]
    found = read_nvidia_pci(str(_tree(tmp_path / "devices", devices)))
    assert [gpu["slot"] for gpu in found["gpus"]] == ["0000:01:00.0", "0000:02:00.0"]
    assert [switch["slot"] for switch in found["nvswitches"]] == [f"0000:0{n}:00.0" for n in (5, 6, 7, 8)]
    assert {(s["device"], s["class"], s["driver"]) for s in found["nvswitches"]} == {
        ("0x22a3", "0x068000", "nvidia-nvswitch")
    }


@pytest.mark.parametrize(
    ("vendor", "pci_class", "kind"),
    [
        ("0x10de", "0x068000", "nvswitches"),  # any NVSwitch, whatever its device id
        ("0x10de", "0x030000", "gpus"),  # VGA controller
        ("0x10de", "0x030200", "gpus"),  # 3D controller (data-center GPUs)
        ("0x10de", "0x040300", None),  # a GPU's HDMI audio function
        ("0x10de", "0x060400", None),  # a PCI bridge of an NVIDIA board
        ("0x1014", "0x068001", None),  # IBM's NVLink bridge (POWER), not NVIDIA's vendor id
        ("0x8086", "0x068000", None),  # another vendor's "other bridge"
    ],
)
def test_class_and_vendor_decide(tmp_path: Path, vendor: str, pci_class: str, kind: str | None) -> None:
    device = {"slot": "0000:9a:00.0", "vendor": vendor, "device": "0x2901", "class": pci_class, "driver": "none"}
    found = read_nvidia_pci(str(_tree(tmp_path / "devices", [device])))
    expected = {"gpus": [], "nvswitches": []}
    if kind:
        expected[kind] = [{"slot": "0000:9a:00.0", "device": "0x2901", "class": pci_class, "driver": "none"}]
    assert found == expected


def test_a_host_without_a_pci_bus_lists_nothing(tmp_path: Path) -> None:
    assert read_nvidia_pci(str(tmp_path / "absent")) == {"gpus": [], "nvswitches": []}


def test_the_module_answers_under_ansible_and_changes_nothing(tmp_path: Path) -> None:
    # This machine's own PCI bus: whatever it holds, the module lists it in the same shape.
    run = run_adhoc(tmp_path, "nvidia_pci", "", "--check")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("localhost | SUCCESS => "), run.stdout
    result = json.loads(run.stdout.partition(" => ")[2])
    assert result["changed"] is False
    assert {key: result[key] for key in ("gpus", "nvswitches")} == read_nvidia_pci()
