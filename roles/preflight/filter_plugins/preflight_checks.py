"""The preflight role's checks: each judges what the probes found and says what to do.

They belong to the preflight role only (roles/preflight/tasks/evaluate.yml), so they
live in the role's filter_plugins rather than plugins/filter/, beside
preflight_probes.py, whose filters turn the probes' results into the data judged here.
Each check was a task of Jinja in evaluate.yml; the names, statuses and messages are
the same, word for word (the report, the verdict and the recordings from a real H200
in tests/unit/fixtures/real-h200-faults/ hold them).

    inputs | preflight_checks

evaluate.yml gathers the inputs (INPUTS: values picked out of the probes' results and
the role's variables) into one mapping; the filter runs every check in the report's
order and returns one {check, status, detail} per check that applies (status PASS,
WARN or FAIL; only FAIL stops the run, in verdict.yml). Each check_* function takes
plain data and returns its result, or None where the check does not apply.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

Result = dict[str, str]

# What the filter takes, each key once: evaluate.yml's inputs must be exactly these.
INPUTS = (
    "distribution", "distribution_version", "distribution_major_version", "supported_os",
    "min_gpus", "lab_no_gpu", "pci_gpus", "pci_nvswitches",
    "smi_state", "driver_version", "cuda_driver_version", "gpu_source", "gpu_probe_msg", "gpus",
    "reboot_pending", "reboot_marker", "fabric_manager",
    "gpu_memory_gaps", "gap_pct", "gap_fatal", "gpu_processes", "stray_fatal",
    "disk", "dev_shm", "shm_min_mib", "shm_limits", "page_size",
    "proc_modules", "nvidia_module_loaded",
    "secure_boot_state", "dkms_key", "dkms_mok", "secure_boot_fatal",
)

# The nvidia-smi check quotes at most this much of the probe's message.
_MESSAGE_CHARS = 400
# Jinja's truncate: a text at most this much longer is quoted whole.
_TRUNCATE_LEEWAY = 5
_MIB = 1048576
# The strings Ansible reads as true or false (an -e value is a string), beside 1 and 0.
_TRUE = frozenset(("yes", "on", "true", "1", "t", "y"))
_FALSE = frozenset(("no", "off", "false", "0", "f", "n"))
_DEV_SHM = "/dev/shm"  # noqa: S108 (the shared memory tmpfs the check measures, not a temporary file)
# files/secure-boot.sh's dkms_key, as the secure-boot check words it.
_DKMS_KEY = {
    "not-enrolled": "not enrolled",
    "absent": "not made yet (DKMS makes it when it first builds the nvidia module)",
    "unknown": "of unknown state (no mokutil)",
}


def _list(value: Any, name: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise AnsibleFilterError(f"preflight_checks: {name}: expected a list, got {type(value).__name__}")
    return list(value)


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"preflight_checks: {name}: expected a mapping, got {type(value).__name__}")
    return value


def _items(value: Any, name: str) -> list[Mapping[str, Any]]:
    return [_mapping(item, f"an item of {name}") for item in _list(value, name)]


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise AnsibleFilterError(f"preflight_checks: {name}: expected a string, got {type(value).__name__}")
    return value


def _flag(value: Any, name: str) -> bool:
    """true or false; "yes", "false" and the like as Ansible reads them."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return value == 1
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise AnsibleFilterError(f"preflight_checks: {name}: expected true or false, got {value!r}")


def _whole(value: Any, name: str) -> int:
    """A whole number; "4" too (an -e value is a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise AnsibleFilterError(f"preflight_checks: {name}: expected a whole number, got {value!r}")
    try:
        return int(value)
    except ValueError as err:
        raise AnsibleFilterError(f"preflight_checks: {name}: expected a whole number, got {value!r}") from err


def _key(item: Mapping[str, Any], key: str, name: str) -> Any:
    if key not in item:
        raise AnsibleFilterError(f"preflight_checks: an item of {name} has no {key}: {dict(item)!r}")
    return item[key]


def _text(value: Any) -> str:
    """A value as Ansible writes it into a message: None as nothing."""
    return "" if value is None else str(value)


def _int(value: Any) -> int:
    """Jinja's `int` filter: "42" and "42.5" give 42, anything else 0."""
    try:
        return int(value, 10) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0


def _truncate(text: str, length: int) -> str:
    """Jinja's `truncate(length)`: cut at the last word that fits, with "..." after it."""
    if len(text) <= length + _TRUNCATE_LEEWAY:
        return text
    return text[: length - 3].rsplit(" ", 1)[0] + "..."


def _result(check: str, status: str, detail: str) -> Result:
    # The tasks trimmed each detail; so does this.
    return {"check": check, "status": status, "detail": detail.strip()}


def check_os(distribution: Any, version: Any, major_version: Any, supported_os: Any) -> Result:
    """The distribution and its version against the supported ones ({distribution: [versions]})."""
    supported = {name: _list(versions, f"supported_os {name}") for name, versions in
                 _mapping(supported_os, "supported_os").items()}
    name = _str(distribution, "distribution")
    host = f"{name} {_text(version)}"
    if name in supported and (major_version in supported[name] or version in supported[name]):
        return {"check": "os", "status": "PASS", "detail": f"{host} is supported"}
    listed = ", ".join(f"{other} {'/'.join(map(str, versions))}" for other, versions in supported.items())
    # Not trimmed, as the task did not trim it.
    return {"check": "os", "status": "FAIL",
            "detail": f"{host} is not supported; llmfleet supports {listed}. Reinstall the host with one of them."}


def check_gpus(pci_gpus: Any, min_gpus: Any, lab_no_gpu: Any) -> Result:
    """Enough NVIDIA GPUs on the PCI bus ({slot, ...} each), or a lab host allowed none."""
    gpus = _items(pci_gpus, "pci_gpus")
    needed = _whole(min_gpus, "min_gpus")
    lab = _flag(lab_no_gpu, "lab_no_gpu")
    if len(gpus) >= needed:
        slots = ", ".join(str(_key(gpu, "slot", "pci_gpus")) for gpu in gpus)
        return _result("gpus", "PASS", f"{len(gpus)} NVIDIA GPU(s) on the PCI bus ({slots}; at least {needed} needed)")
    if lab:
        return _result("gpus", "WARN", "NO NVIDIA GPU on the PCI bus. This host passes only because "
                       "preflight_allow_no_gpu is true (lab hosts); it cannot serve a model on a GPU")
    return _result("gpus", "FAIL", f"{len(gpus)} NVIDIA GPU(s) on the PCI bus, {needed} needed. Check that the GPUs "
                   "are seated and powered (lspci -nn | grep -i nvidia), or lower preflight_min_gpus; a lab host "
                   "without a GPU needs preflight_allow_no_gpu: true")


def check_nvidia_smi(
    smi_state: Any, gpus: Any, driver_version: Any, cuda_driver_version: Any, source: Any, message: Any,
    reboot_pending: Any, reboot_marker: Any, lab_no_gpu: Any,
) -> Result:
    """What the driver reports (the gpu_facts module's state: ok, absent or failing, and its msg)."""
    state = _str(smi_state, "smi_state")
    count = len(_list(gpus, "gpus"))
    reboot = _flag(reboot_pending, "reboot_pending")
    marker = _str(reboot_marker, "reboot_marker")
    lab = _flag(lab_no_gpu, "lab_no_gpu")
    output = _truncate(_str("" if message is None else message, "gpu_probe_msg"), _MESSAGE_CHARS)
    if state == "ok" and count > 0:
        return _result("nvidia-smi", "PASS", f"driver {_text(driver_version)} (CUDA {_text(cuda_driver_version)}), "
                       f"{count} GPU(s), read through {_text(source)}")
    status = "WARN" if state == "absent" or reboot or lab else "FAIL"
    if state == "absent":
        detail = "not installed yet (the nvidia_driver role installs it): GPU memory was not checked"
    elif reboot:
        detail = (f"fails, and the nvidia_driver role is waiting for a reboot ({marker}): reboot the host, "
                  f"then rerun. {output}")
    else:
        detail = (f"fails or lists no GPU: the driver is installed but not working. {output}. Check `dkms status`, "
                  "`lsmod | grep nvidia`, `dmesg | grep -i -e nvrm -e xid`, then rerun the nvidia_driver role")
    return _result("nvidia-smi", status, detail)


def check_gpus_visible(smi_state: Any, pci_gpus: Any, gpus: Any) -> Result | None:
    """The driver lists every GPU of the PCI bus: one it does not has fallen off the bus ("GPU has
    fallen off the bus", Xid 79) or is bound to another driver (nouveau, vfio-pci). Only where
    the driver answers and the PCI bus has a GPU."""
    bus = _items(pci_gpus, "pci_gpus")
    listed = len(_list(gpus, "gpus"))
    if _str(smi_state, "smi_state") != "ok" or not bus:
        return None
    if listed >= len(bus):
        return _result("gpus-visible", "PASS", f"nvidia-smi lists all {len(bus)} GPU(s) of the PCI bus")
    bound = ", ".join(f"{_key(gpu, 'slot', 'pci_gpus')}={_key(gpu, 'driver', 'pci_gpus')}" for gpu in bus)
    return _result("gpus-visible", "FAIL", f"{len(bus)} GPU(s) on the PCI bus, nvidia-smi lists {listed}. Kernel "
                   f"drivers bound: {bound}. A GPU missing from nvidia-smi has fallen off the bus (dmesg | grep -i "
                   "xid) or is bound to another driver; power-cycle the host or reseat the card")


def check_nvswitch(
    pci_nvswitches: Any, fabric_manager: Any, smi_state: Any, reboot_pending: Any, reboot_marker: Any
) -> Result:
    """NVSwitches ({slot, device, ...} each) and Fabric Manager (what `systemctl is-active` printed).

    On an NVSwitch system (HGX/DGX A100, H100, H200 SXM) CUDA answers every call with error
    802 until Fabric Manager has set up the NVLink fabric, while nvidia-smi works. Never FAIL:
    before the driver is installed, the nvidia_driver role (after preflight) installs it too,
    and fails itself when Fabric Manager does not start.
    """
    switches = _items(pci_nvswitches, "pci_nvswitches")
    fm_state = _str("" if fabric_manager is None else fabric_manager, "fabric_manager").strip() or "not installed"
    state = _str(smi_state, "smi_state")
    reboot = _flag(reboot_pending, "reboot_pending")
    marker = _str(reboot_marker, "reboot_marker")
    if not switches:
        return _result("nvswitch", "PASS", "none on the PCI bus: this host needs no NVIDIA Fabric Manager")
    listing = ", ".join(
        f"{_key(switch, 'slot', 'pci_nvswitches')} device {_key(switch, 'device', 'pci_nvswitches')}"
        for switch in switches
    )
    found = f"{len(switches)} NVSwitch(es) ({listing}): "
    if fm_state == "active":
        return _result("nvswitch", "PASS", found + "nvidia-fabricmanager is active, as CUDA needs on an NVSwitch "
                       "system")
    if state == "absent" and not reboot:
        return _result("nvswitch", "PASS", found + "CUDA will start only once NVIDIA Fabric Manager runs, at exactly "
                       "the driver's version; the nvidia_driver role installs it with the driver "
                       "(nvidia_driver_fabric_manager: auto)")
    waiting = f"The nvidia_driver role is waiting for a reboot ({marker}): reboot, then rerun. " if reboot else ""
    return _result("nvswitch", "WARN", found + f"nvidia-fabricmanager is {fm_state}, so CUDA fails on every GPU "
                   f'(error 802, "system not yet initialized") while nvidia-smi works. {waiting}Run the '
                   "nvidia_driver role (it installs and starts Fabric Manager at the driver's version), and see "
                   "`systemctl status nvidia-fabricmanager`: Fabric Manager starts only when its version equals the "
                   "driver's exactly (compare `nvidia-smi --query-gpu=driver_version --format=csv,noheader` with "
                   "`dpkg -l 'nvidia-fabricmanager*'`)")


def check_gpu_memory(gpus: Any, gaps: Any, gap_pct: Any, gap_fatal: Any) -> Result | None:
    """No GPU with much less free memory than its siblings (preflight_gpu_memory_gaps found them).
    Only where the driver lists a GPU."""
    listed = _items(gpus, "gpus")
    short = _items(gaps, "gpu_memory_gaps")
    fatal = _flag(gap_fatal, "gap_fatal")
    if not listed:
        return None
    if not short:
        free = ", ".join(
            f"GPU {_key(gpu, 'index', 'gpus')} {_key(gpu, 'memory_free_mib', 'gpus')}" for gpu in listed
        )
        return _result("gpu-memory", "PASS",
                       f"free memory per GPU (MiB): {free}; none more than {_text(gap_pct)}% below its siblings")
    try:
        found = "".join(
            f"GPU {_text(gap['index'])} ({_text(gap['name'])}) has {_text(gap['free'])} MiB free of "
            f"{_text(gap['total'])} MiB ({_text(gap['used'])} MiB used, display {_text(gap['display'])}): "
            f"{_text(gap['gap'])} MiB ({_text(gap['gap_pct'])}%) less than GPU {_text(gap['sibling'])}'s "
            f"{_text(gap['sibling_free'])} MiB. "
            for gap in short
        )
    except KeyError as err:
        raise AnsibleFilterError(f"preflight_checks: an item of gpu_memory_gaps has no {err}") from err
    status = "FAIL" if fatal else "WARN"
    return _result("gpu-memory", status, found + "vLLM gives every GPU of a tensor-parallel group the same cache, so "
                   "the group gets what the emptiest GPU holds, or fails to start. Free it: move the display to "
                   "another GPU or an onboard one (or stop the display manager), and stop or kill what holds the "
                   "memory (nvidia-smi lists the processes); or leave that GPU out of the engine's GPU ids. To accept "
                   "it, set preflight_gpu_free_memory_gap_fatal: false (or raise preflight_gpu_free_memory_gap_pct, "
                   f"{_text(gap_pct)} now)")


def _holder(process: Mapping[str, Any]) -> str:
    container = process.get("container_id")
    if container and not isinstance(container, str):
        raise AnsibleFilterError(f"preflight_checks: a GPU process's container_id is not a string: {container!r}")
    where = f", container {container[:12]}" if container else ", on the host"
    gpu, pid = _key(process, "gpu_index", "gpu_processes"), _key(process, "pid", "gpu_processes")
    return (f"GPU {_text(gpu)}: pid {_text(pid)} ({process.get('name') or '?'}{where}) holds "
            f"{process.get('used_memory_mib') or '?'} MiB. ")


def check_gpu_processes(smi_state: Any, gpu_processes: Any, stray_fatal: Any) -> Result | None:
    """No process but the engines holds GPU memory (DESIGN.md failure mode #6: a crashed process
    still holding it). The processes come from preflight_gpu_processes, each with `engine`
    (it runs in one of the vllm role's containers). Only where the driver answers."""
    processes = _items(gpu_processes, "gpu_processes")
    fatal = _flag(stray_fatal, "stray_fatal")
    if _str(smi_state, "smi_state") != "ok":
        return None
    stray = [process for process in processes if not process.get("engine")]
    engines = len(processes) - len(stray)
    if not stray:
        but = f" but the {engines} engine process(es) in the vllm role containers" if engines else ""
        return _result("gpu-processes", "PASS", f"no process holds GPU memory{but}")
    status = "FAIL" if fatal else "WARN"
    return _result("gpu-processes", status, "".join(_holder(process) for process in stray) + "Only the vllm role's "
                   "engine containers should hold GPU memory: a crashed engine or a forgotten job shrinks every "
                   "engine's KV cache, or stops it from starting. Stop it (kill the pid, or docker rm -f the "
                   "container), then rerun; to accept it, set preflight_gpu_stray_processes_fatal: false")


def check_disk(disk: Any) -> Result:
    """Free space per filesystem against the requirements on it (preflight_disk added them up)."""
    filesystems = _items(disk, "disk")
    if not filesystems:
        return _result("disk", "PASS", "no disk requirements (preflight_disk_requirements is empty)")
    try:
        found = "; ".join(
            f"{_text(fs['mount'])}: {_text(fs['available_gib'])} GiB free, {_text(fs['needed_gib'])} GiB needed "
            f"({' + '.join(map(str, _list(fs['uses'], 'disk uses')))}){': TOO LITTLE' if fs['short'] else ''}"
            for fs in filesystems
        )
    except KeyError as err:
        raise AnsibleFilterError(f"preflight_checks: an item of disk has no {err}") from err
    if not any(fs["short"] for fs in filesystems):
        return _result("disk", "PASS", found)
    return _result("disk", "FAIL", found + " -- free space there, mount a larger disk at the path, or change "
                   "preflight_disk_requirements (and the roles' paths) to a filesystem with room")


def check_dev_shm(dev_shm: Any, shm_min_mib: Any) -> Result:
    """The size of /dev/shm: its df entry ({mount, size_kib, ...}, preflight_df), or None where df
    had none. Where its mount is not /dev/shm, it is a plain directory of another filesystem."""
    needed = _whole(shm_min_mib, "shm_min_mib")
    entry = None if dev_shm is None else _mapping(dev_shm, "dev_shm")
    mounted = entry is not None and entry.get("mount", "") == _DEV_SHM
    size_mib = 0
    if entry is not None and mounted:
        size_kib = _key(entry, "size_kib", "dev_shm")
        if isinstance(size_kib, bool) or not isinstance(size_kib, (int, float)):
            raise AnsibleFilterError(f"preflight_checks: dev_shm: size_kib is not a number: {size_kib!r}")
        size_mib = int(size_kib / 1024)
    found = f"{_DEV_SHM} is {size_mib} MiB" if mounted else f"{_DEV_SHM} is not a mounted tmpfs"
    if size_mib >= needed:
        return _result("dev-shm", "PASS", f"{found}, {needed} MiB needed")
    return _result("dev-shm", "FAIL", f"{found}, {needed} MiB needed. NCCL keeps its buffers there under tensor "
                   'parallelism and fails with "unhandled system error" when it fills. Mount a larger tmpfs (fstab: '
                   "tmpfs /dev/shm tmpfs defaults,size=50% 0 0); in a container, run it with --shm-size or --ipc=host")


def check_kernel_shm(shm_limits: Any, page_size: Any, shm_min_mib: Any) -> Result:
    """The kernel's shared memory limits: the lines of kernel.shmmax, shmall (in pages) and
    shmmni, and the page size, as the probes printed them."""
    lines = _list(shm_limits, "shm_limits")
    if len(lines) < 3:
        raise AnsibleFilterError(f"preflight_checks: shm_limits: expected shmmax, shmall and shmmni, got {lines!r}")
    needed_mib = _whole(shm_min_mib, "shm_min_mib")
    shmmax, shmmni = _int(lines[0]), _int(lines[2])
    ok = shmmax >= needed_mib * _MIB and _int(lines[1]) * _int(page_size) >= needed_mib * _MIB
    found = (f"kernel.shmmax {shmmax} bytes, kernel.shmall {_text(lines[1])} pages of {_text(page_size)} bytes, "
             f"kernel.shmmni {shmmni}")
    if ok:
        return _result("kernel-shm", "PASS", found)
    return _result("kernel-shm", "FAIL", f"{found}: below the {needed_mib} MiB one shared memory segment may need. "
                   "Raise them (the kernel_tuning role computes them from memory) or lower preflight_shm_min_mib")


def check_nouveau(proc_modules: Any, smi_state: Any, nvidia_module_loaded: Any, reboot_pending: Any) -> Result:
    """nouveau is not loaded. proc_modules: /proc/modules as slurp read it (base64), or None where
    the kernel has none. The NVIDIA driver is installed where nvidia-smi answers or its module
    is loaded."""
    installed = _str(smi_state, "smi_state") != "absent" or _flag(nvidia_module_loaded, "nvidia_module_loaded")
    reboot = _flag(reboot_pending, "reboot_pending")
    if proc_modules is None:
        return _result("nouveau", "PASS", "not loaded (this kernel has no /proc/modules: no loadable modules)")
    try:
        modules = base64.b64decode(_str(proc_modules, "proc_modules")).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError) as err:
        raise AnsibleFilterError(f"preflight_checks: proc_modules is not base64 (slurp's content): {err}") from err
    if not re.search("^nouveau ", modules, flags=re.MULTILINE):
        return _result("nouveau", "PASS", "not loaded")
    if installed and not reboot:
        return _result("nouveau", "FAIL", "LOADED although the NVIDIA driver is installed: it holds the GPUs, so the "
                       "NVIDIA driver cannot. Blacklist it (the nvidia_driver role writes "
                       "/etc/modprobe.d/llmfleet-blacklist-nouveau.conf), rebuild the initramfs (update-initramfs -u) "
                       "and reboot")
    return _result("nouveau", "WARN", "loaded: the nvidia_driver role blacklists it; it stays loaded until the host "
                   "reboots")


def check_secure_boot(state: Any, dkms_key: Any, dkms_mok: Any, fatal: Any) -> Result:
    """Secure Boot against DKMS's module signing key (files/secure-boot.sh's state and dkms_key)."""
    state = _str(state, "secure_boot_state")
    key = _str(dkms_key, "dkms_key")
    mok = _str(dkms_mok, "dkms_mok")
    refuse = _flag(fatal, "secure_boot_fatal")
    if state == "no-efi":
        return _result("secure-boot", "PASS", "no EFI firmware (legacy BIOS boot, or a container): the kernel does "
                       "not enforce module signatures")
    if state == "disabled":
        return _result("secure-boot", "PASS", "disabled: unsigned modules load")
    if state != "enabled":
        return _result("secure-boot", "WARN", "unknown (no mokutil and no readable SecureBoot EFI variable): check it "
                       "with mokutil --sb-state")
    if key == "enrolled":
        return _result("secure-boot", "PASS",
                       f"enabled; DKMS's signing key {mok} is enrolled, so the nvidia module it builds loads")
    if key not in _DKMS_KEY:
        raise AnsibleFilterError(
            f"preflight_checks: dkms_key {key!r} is none of enrolled, {', '.join(_DKMS_KEY)} (files/secure-boot.sh)"
        )
    status = "FAIL" if key == "not-enrolled" and refuse else "WARN"
    return _result("secure-boot", status, f"ENABLED: the kernel loads only signed modules, and DKMS's signing key "
                   f"{mok} is {_DKMS_KEY[key]}. Enrol it (mokutil --import {mok}, reboot, confirm at the console's "
                   "MOK manager), or turn Secure Boot off in the firmware; otherwise the nvidia module is refused at "
                   "load")


def preflight_checks(inputs: Any) -> list[Result]:
    """Every check that applies, in the report's order: {check, status, detail} each."""
    given = _mapping(inputs, "inputs")
    missing = [name for name in INPUTS if name not in given]
    unknown = sorted(set(given) - set(INPUTS))
    if missing or unknown:
        raise AnsibleFilterError(
            f"preflight_checks: the inputs lack {', '.join(missing) or 'nothing'} and have unknown "
            f"{', '.join(unknown) or 'nothing'}; evaluate.yml's inputs must be the plugin's INPUTS"
        )
    results = [
        check_os(given["distribution"], given["distribution_version"], given["distribution_major_version"],
                 given["supported_os"]),
        check_gpus(given["pci_gpus"], given["min_gpus"], given["lab_no_gpu"]),
        check_nvidia_smi(given["smi_state"], given["gpus"], given["driver_version"], given["cuda_driver_version"],
                         given["gpu_source"], given["gpu_probe_msg"], given["reboot_pending"], given["reboot_marker"],
                         given["lab_no_gpu"]),
        check_gpus_visible(given["smi_state"], given["pci_gpus"], given["gpus"]),
        check_nvswitch(given["pci_nvswitches"], given["fabric_manager"], given["smi_state"], given["reboot_pending"],
                       given["reboot_marker"]),
        check_gpu_memory(given["gpus"], given["gpu_memory_gaps"], given["gap_pct"], given["gap_fatal"]),
        check_gpu_processes(given["smi_state"], given["gpu_processes"], given["stray_fatal"]),
        check_disk(given["disk"]),
        check_dev_shm(given["dev_shm"], given["shm_min_mib"]),
        check_kernel_shm(given["shm_limits"], given["page_size"], given["shm_min_mib"]),
        check_nouveau(given["proc_modules"], given["smi_state"], given["nvidia_module_loaded"],
                      given["reboot_pending"]),
        check_secure_boot(given["secure_boot_state"], given["dkms_key"], given["dkms_mok"],
                          given["secure_boot_fatal"]),
    ]
    return [result for result in results if result is not None]


class FilterModule:
    """The preflight role's checks."""

    def filters(self) -> dict[str, Any]:
        return {"preflight_checks": preflight_checks}
