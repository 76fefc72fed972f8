"""Read llmfleet's GPU facts from NVML, through ``nvidia-ml-py`` (``import pynvml``).

NVML is the library nvidia-smi itself reads; asking it directly needs no
process and no parsing. ``pynvml`` is imported only when ``read_nvml`` runs,
so hosts without it can still import this file (the ``gpu_facts`` module then
falls back to ``gpu_smi.py``). The result has the shape ``gpu_smi.parse_smi_xml``
documents, with ``"source": "nvml"``.

Every per-GPU query that a GPU or driver does not support (MIG mode on a
GeForce card, ECC on most consumer cards) yields None instead of failing the
whole read; NVML failing to initialise (no driver, driver/library mismatch)
raises NvmlUnavailable with NVML's own words.

Stdlib only (pynvml is looked up at run time): Ansible ships this file to hosts
as ``ansible.module_utils.gpu_nvml``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

MIB = 1 << 20
T = TypeVar("T")


class NvmlUnavailable(RuntimeError):
    """pynvml is missing, or NVML cannot talk to a driver."""


def load_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as error:
        raise NvmlUnavailable(f"pynvml (nvidia-ml-py) is not installed for this Python: {error}") from error


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(value: int) -> str:
    """NVML's 13000 -> '13.0' (major x 1000 + minor x 10)."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _mode(value: Any) -> str | None:
    if value is None:
        return None
    return "Enabled" if int(value) else "Disabled"


def read_nvml(nvml: ModuleType | None = None) -> dict[str, Any]:
    """The host's GPU facts from NVML; NvmlUnavailable when NVML cannot be used."""
    nvml = nvml or load_pynvml()
    error_type: type[Exception] = getattr(nvml, "NVMLError", Exception)

    def optional(call: Callable[[], T]) -> T | None:
        """A query this GPU or driver may not support."""
        try:
            return call()
        except error_type:
            return None

    try:
        nvml.nvmlInit()
    except error_type as error:
        raise NvmlUnavailable(f"NVML could not start (is the NVIDIA driver loaded?): {error}") from error
    try:
        driver = _str(nvml.nvmlSystemGetDriverVersion())
        cuda = optional(nvml.nvmlSystemGetCudaDriverVersion_v2) or optional(nvml.nvmlSystemGetCudaDriverVersion)
        gpus: list[dict[str, Any]] = []
        processes: list[dict[str, Any]] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = _gpu(nvml, handle, index, optional)
            gpus.append(gpu)
            processes.extend(_processes(nvml, handle, gpu, optional))
    except error_type as error:
        raise NvmlUnavailable(f"NVML failed while reading the GPUs: {error}") from error
    finally:
        optional(nvml.nvmlShutdown)
    return {
        "source": "nvml",
        "driver_version": driver,
        "cuda_driver_version": _cuda_version(int(cuda)) if cuda else None,
        "gpus": gpus,
        "processes": processes,
    }


def _gpu(nvml: ModuleType, handle: Any, index: int, optional: Callable[[Callable[[], Any]], Any]) -> dict[str, Any]:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    capability = optional(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    mig = optional(lambda: nvml.nvmlDeviceGetMigMode(handle))
    ecc = optional(lambda: nvml.nvmlDeviceGetEccMode(handle))
    power_limit = optional(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    power_draw = optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    uncorrected = optional(
        lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        )
    )

    def clock(kind: str, maximum: bool = False) -> int | None:
        query = nvml.nvmlDeviceGetMaxClockInfo if maximum else nvml.nvmlDeviceGetClockInfo
        value = optional(lambda: query(handle, getattr(nvml, kind)))
        return None if value is None else int(value)

    return {
        "index": index,
        "minor_number": optional(lambda: int(nvml.nvmlDeviceGetMinorNumber(handle))),
        "name": _str(nvml.nvmlDeviceGetName(handle)),
        "uuid": _str(nvml.nvmlDeviceGetUUID(handle)),
        "pci_bus_id": _str(nvml.nvmlDeviceGetPciInfo(handle).busId),
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else None,
        "memory_total_mib": int(memory.total) // MIB,
        "memory_used_mib": int(memory.used) // MIB,
        "memory_free_mib": int(memory.free) // MIB,
        "mig_mode": _mode(mig[0]) if mig else None,
        "persistence_mode": _mode(optional(lambda: nvml.nvmlDeviceGetPersistenceMode(handle))),
        "display_active": _mode(optional(lambda: nvml.nvmlDeviceGetDisplayActive(handle))),
        "clocks": {
            "graphics_mhz": clock("NVML_CLOCK_GRAPHICS"),
            "sm_mhz": clock("NVML_CLOCK_SM"),
            "memory_mhz": clock("NVML_CLOCK_MEM"),
            "sm_max_mhz": clock("NVML_CLOCK_SM", maximum=True),
            "memory_max_mhz": clock("NVML_CLOCK_MEM", maximum=True),
        },
        "power_limit_w": None if power_limit is None else round(int(power_limit) / 1000, 2),
        "power_draw_w": None if power_draw is None else round(int(power_draw) / 1000, 2),
        "temperature_c": optional(lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
        "ecc": {
            "current": _mode(ecc[0]) if ecc else None,
            "pending": _mode(ecc[1]) if ecc else None,
            "uncorrected_volatile": None if uncorrected is None else int(uncorrected),
        },
    }


def _processes(
    nvml: ModuleType, handle: Any, gpu: dict[str, Any], optional: Callable[[Callable[[], Any]], Any]
) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    seen: set[int] = set()
    for kind, query in (("C", "nvmlDeviceGetComputeRunningProcesses"), ("G", "nvmlDeviceGetGraphicsRunningProcesses")):
        running: list[Any] = optional(partial(getattr(nvml, query), handle)) or []
        for process in running:
            pid = int(process.pid)
            if pid in seen:
                # A process with both a compute and a graphics context: one entry, type C+G as nvidia-smi says.
                for entry in result:
                    if entry["pid"] == pid:
                        entry["type"] = "C+G"
                continue
            seen.add(pid)
            used = getattr(process, "usedGpuMemory", None)
            name = optional(partial(nvml.nvmlSystemGetProcessName, pid))
            result.append(
                {
                    "gpu_index": gpu["index"],
                    "gpu_uuid": gpu["uuid"],
                    "pid": pid,
                    "name": None if name is None else _str(name),
                    "type": kind,
                    "used_memory_mib": None if used is None else int(used) // MIB,
                }
            )
    return result
