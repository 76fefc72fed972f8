"""The NVIDIA devices on the PCI bus, read from sysfs: GPUs and NVSwitches.

Every PCI device has a directory under /sys/bus/pci/devices (its slot, such as
``0000:18:00.0``) with ``vendor``, ``device`` and ``class`` files; a device
bound to a kernel driver has a ``driver`` link. NVIDIA's vendor id is 0x10de.

- GPUs are display controllers: class 0x03xxxx (0x0300 VGA, 0x0302 3D).
- NVSwitches are bridges of the subclass "other": class 0x0680xx. This is how
  NCCL tells an NVSwitch from a GPU (its ncclDeviceType reads the same class
  file), and it covers every generation without a list of device ids: 0x1af1
  is the A100 generation's NVSwitch, 0x22a3 the H100/H200 generation's.
  (NVIDIA's nForce chipsets of the 2000s also had 0x0680 functions; they are
  never on a GPU server.)

On an NVSwitch system (HGX/DGX A100, H100, H200 SXM) CUDA does not initialise
until NVIDIA Fabric Manager has set up the fabric; the nvidia_driver role
installs it where this finds NVSwitches.

Stdlib only: Ansible ships this file to hosts as ``ansible.module_utils.nvidia_pci``.
"""

from __future__ import annotations

from pathlib import Path

SYSFS_PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIX = "0x03"
NVSWITCH_CLASS_PREFIX = "0x0680"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip().lower()
    except (OSError, UnicodeDecodeError):
        return ""


def read_nvidia_pci(devices_dir: str = SYSFS_PCI_DEVICES) -> dict[str, list[dict[str, str]]]:
    """The NVIDIA GPUs and NVSwitches under devices_dir, each {slot, device, class, driver}, in slot order.

    ``driver`` is the bound kernel driver's name (nvidia, nvidia-nvswitch, nouveau, vfio-pci) or ``none``.
    A directory that does not exist (a host without PCI, such as some containers) lists nothing.
    """
    found: dict[str, list[dict[str, str]]] = {"gpus": [], "nvswitches": []}
    root = Path(devices_dir)
    try:
        slots = sorted(root.iterdir(), key=lambda path: path.name)
    except OSError:
        return found
    for device in slots:
        if _read(device / "vendor") != NVIDIA_VENDOR:
            continue
        pci_class = _read(device / "class")
        if pci_class.startswith(GPU_CLASS_PREFIX):
            kind = "gpus"
        elif pci_class.startswith(NVSWITCH_CLASS_PREFIX):
            kind = "nvswitches"
        else:
            continue
        driver = device / "driver"
        found[kind].append(
            {
                "slot": device.name,
                "device": _read(device / "device"),
                "class": pci_class,
                "driver": Path(str(driver.readlink())).name if driver.is_symlink() else "none",
            }
        )
    return found
