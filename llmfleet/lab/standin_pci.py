"""The lab's STAND-IN PCI listing: NVSwitches on one GPU host. NOT a real machine's devices.

files/standins/pci-devices.yml lists the NVIDIA devices of a GPU host with an NVLink switch
fabric (two GPUs, the ones the stand-in nvidia-smi reports, and the four NVSwitches of an
HGX H100/H200 board) in the layout of sysfs. `llmfleet lab up` writes it as a directory tree
under the cache and mounts it read-only over /sys/bus/pci/devices of each lab host whose
inventory entry sets `lab_standin_pci: true`, when it creates that host. The roles' NVSwitch
detection (plugins/module_utils/nvidia_pci.py) then reads it where it reads a real host's, and
the nvidia_driver role installs and runs the stand-in Fabric Manager there. The nvidia_driver
role's Molecule scenario mounts the same listing (its prepare.yml).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import yaml

from llmfleet.errors import LlmfleetError
from llmfleet.lab.standins import STANDINS_DIR
from llmfleet.paths import cache_dir

SPEC_FILE = STANDINS_DIR / "pci-devices.yml"
MOUNT_POINT = "/sys/bus/pci/devices"
_KEYS = ("slot", "vendor", "device", "class", "driver")


def load_devices(spec_file: Path = SPEC_FILE) -> list[dict[str, str]]:
    """The listed devices, each {slot, vendor, device, class, driver}."""
    try:
        devices = yaml.safe_load(spec_file.read_text())["devices"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise LlmfleetError(f"{spec_file}: cannot read the stand-in PCI listing ({error})") from error
    if not isinstance(devices, list) or not all(
        isinstance(device, dict) and all(isinstance(device.get(key), str) and device[key] for key in _KEYS)
        for device in devices
    ):
        raise LlmfleetError(f"{spec_file}: devices must be a list of {{{', '.join(_KEYS)}}} strings")
    return [{key: device[key] for key in _KEYS} for device in devices]


def write_tree(root: Path, devices: list[dict[str, str]]) -> Path:
    """The devices as sysfs lays them out: root/<slot>/{vendor,device,class}, and a driver link."""
    root.mkdir(parents=True)
    for device in devices:
        slot = root / device["slot"]
        slot.mkdir()
        for key in ("vendor", "device", "class"):
            (slot / key).write_text(device[key] + "\n")
        (slot / "driver").symlink_to(f"../../../bus/pci/drivers/{device['driver']}")
    return root


def ensure_tree(spec_file: Path = SPEC_FILE) -> Path:
    """The listing's tree in the cache, keyed by the listing's content; written once, then reused."""
    key = hashlib.sha256(spec_file.read_bytes()).hexdigest()[:12]
    root = cache_dir() / "standin-pci" / key
    if root.is_dir():
        return root
    devices = load_devices(spec_file)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root.parent))
    write_tree(staging / "devices", devices)
    try:
        (staging / "devices").rename(root)
    except OSError:
        if not root.is_dir():  # not another process that got there first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root
