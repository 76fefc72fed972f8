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

Which kernel modules drive the GPUs follows from their generation, read from the
PCI device id (``choose_kernel_modules``): NVIDIA's open modules run only on Turing
and newer, which need the GSP that Turing brought; Blackwell runs only on them.

Stdlib only: Ansible ships this file to hosts as ``ansible.module_utils.nvidia_pci``.
"""

from __future__ import annotations

from pathlib import Path

SYSFS_PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIX = "0x03"
NVSWITCH_CLASS_PREFIX = "0x0680"

# The GPU generations by PCI device id: (first id, last id, generation). NVIDIA
# numbers each chip's ids in one block, so ranges name them without a list of
# every product; the ids in the comments are examples from NVIDIA's published
# device lists. Turing starts at 0x1e00 (TU102), and every GPU the open modules
# support has an id from there on (open-gpu-kernel-modules' supported-GPU list).
GENERATIONS: tuple[tuple[int, int, str], ...] = (
    (0x0000, 0x1DFF, "pre-Turing"),  # Maxwell, Pascal, Volta (V100 0x1db4) and older
    (0x1E00, 0x1FFF, "Turing"),  # TU102, TU104, TU106 (T4 0x1eb8)
    (0x2000, 0x20FF, "Ampere"),  # GA100 (A100 0x20b0, A800 0x20f5)
    (0x2100, 0x21FF, "Turing"),  # TU116, TU117 (GTX 1660 0x2184)
    (0x2200, 0x22FF, "Ampere"),  # GA102 (A40 0x2235, A10 0x2236)
    (0x2300, 0x23FF, "Hopper"),  # GH100 (H100 SXM 0x2330, H200 0x2335, GH200 0x2342)
    (0x2400, 0x25FF, "Ampere"),  # GA103, GA104, GA106, GA107 (A16 0x25b6)
    (0x2600, 0x28FF, "Ada Lovelace"),  # AD102 to AD107 (RTX 4090 0x2684, L40S 0x26b9, L4 0x27b8)
    (0x2900, 0xFFFF, "Blackwell or newer"),  # GB100 (B200 0x2901), GB202 (RTX PRO 6000 0x2bb5)
)
# What each generation allows: the open modules need Turing's GSP; Blackwell has
# no proprietary module at all; for Hopper NVIDIA recommends the open modules
# (and Grace Hopper needs them). From branch 560 on, NVIDIA's own default is open.
NO_OPEN_MODULES = frozenset({"pre-Turing"})
OPEN_MODULES_ONLY = frozenset({"Blackwell or newer"})
OPEN_MODULES_RECOMMENDED = frozenset({"Hopper"})
OPEN_DEFAULT_FROM_BRANCH = 560
KERNEL_MODULES = ("auto", "open", "proprietary")


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


def gpu_generation(device_id: str) -> str:
    """The generation of an NVIDIA GPU from its PCI device id ("0x2335": "Hopper")."""
    number = int(device_id, 16)
    for first, last, generation in GENERATIONS:
        if first <= number <= last:
            return generation
    raise ValueError(f"not a PCI device id: {device_id!r}")


def choose_kernel_modules(gpus: list[dict[str, str]], requested: str, branch: int) -> dict[str, str]:
    """Which kernel modules (open or proprietary) drive these GPUs on this driver branch, and why.

    ``gpus`` is read_nvidia_pci()'s list, ``requested`` one of KERNEL_MODULES. Returns
    {modules, reason, problem}: ``problem`` is empty, or says why no flavour fits (then
    ``modules`` is the one asked for or chosen) and what to do.
    """
    if requested not in KERNEL_MODULES:
        raise ValueError(f"kernel modules must be one of {', '.join(KERNEL_MODULES)}, not {requested!r}")
    found = {gpu["slot"]: gpu_generation(gpu["device"]) for gpu in gpus}
    listed = ", ".join(f"{slot} {generation}" for slot, generation in found.items()) or "no NVIDIA GPU on the PCI bus"
    generations = set(found.values())
    no_open = sorted(slot for slot, generation in found.items() if generation in NO_OPEN_MODULES)
    open_only = sorted(slot for slot, generation in found.items() if generation in OPEN_MODULES_ONLY)
    if no_open and open_only:
        return {
            "modules": requested,
            "reason": listed,
            "problem": f"GPUs older than Turing ({', '.join(no_open)}) need the proprietary kernel modules and "
            f"Blackwell ones ({', '.join(open_only)}) the open modules; one driver loads one flavour. "
            "Put these GPUs in different hosts.",
        }
    if requested == "auto":
        modules, reason = _auto(generations, branch, bool(no_open), bool(open_only))
        return {"modules": modules, "reason": f"{reason} ({listed})", "problem": ""}
    problem = ""
    if requested == "open" and no_open:
        problem = (
            "The open kernel modules run only on Turing and newer GPUs, and these are older: "
            f"{', '.join(no_open)}. "
            "Set nvidia_driver_kernel_modules to proprietary (or auto)."
        )
    elif requested == "proprietary" and open_only:
        problem = (
            "These GPUs run only with the open kernel modules (Blackwell has no proprietary one): "
            f"{', '.join(open_only)}. "
            "Set nvidia_driver_kernel_modules to open (or auto)."
        )
    reason = f"nvidia_driver_kernel_modules is {requested} ({listed})"
    return {"modules": requested, "reason": reason, "problem": problem}


def _auto(generations: set[str], branch: int, no_open: bool, open_only: bool) -> tuple[str, str]:
    if no_open:
        return "proprietary", "a GPU older than Turing, which the open modules do not drive"
    if open_only:
        return "open", "a Blackwell or newer GPU, which only the open modules drive"
    if generations and generations <= OPEN_MODULES_RECOMMENDED:
        return "open", "Hopper GPUs, for which NVIDIA recommends the open modules"
    if branch >= OPEN_DEFAULT_FROM_BRANCH:
        return "open", f"NVIDIA's default from branch {OPEN_DEFAULT_FROM_BRANCH}, and this is {branch}"
    return "proprietary", f"NVIDIA's default before branch {OPEN_DEFAULT_FROM_BRANCH}, and this is {branch}"


def loaded_module_flavour(nvrm_line: str) -> str:
    """open or proprietary: the flavour the first line of /proc/driver/nvidia/version names.

    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." is the
    open module's (read on the lent H200); "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03 ..."
    the proprietary one's.
    """
    if not nvrm_line.startswith("NVRM version: NVIDIA UNIX") or "Kernel Module" not in nvrm_line:
        raise ValueError(f"not the first line of /proc/driver/nvidia/version: {nvrm_line!r}")
    return "open" if "Open Kernel Module" in nvrm_line else "proprietary"
