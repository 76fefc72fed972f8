"""Parse ``nvidia-smi -q -x`` (the driver's full XML report) into llmfleet's GPU facts.

The ``gpu_facts`` module reads NVML first (``gpu_nvml.py``) and falls back to
this parser where the host has no ``nvidia-ml-py``; the lab's STAND-IN
nvidia-smi prints the same XML, so preflight runs one parser on real and
stand-in hosts. Both readers return the same shape::

    {"driver_version": "580.159.04", "cuda_driver_version": "13.0", "source": "nvidia-smi",
     "gpus": [{"index": 0, "name": ..., "uuid": ..., "pci_bus_id": ..., "compute_capability": "9.0" | None,
               "memory_total_mib": ..., "memory_used_mib": ..., "memory_free_mib": ...,
               "mig_mode": "Enabled" | "Disabled" | None, "persistence_mode": ..., "display_active": ...,
               "clocks": {"sm_mhz", "memory_mhz", "graphics_mhz", "sm_max_mhz", "memory_max_mhz"},
               "power_limit_w": ..., "power_draw_w": ..., "temperature_c": ...,
               "ecc": {"current": ..., "pending": ..., "uncorrected_volatile": int | None}}],
     "processes": [{"gpu_index", "gpu_uuid", "pid", "name", "type", "used_memory_mib"}]}

Values the report marks "N/A" (or "[N/A]", "Not Supported") become None. The
XML has changed between driver branches (power readings moved from
``power_readings/power_limit`` to ``gpu_power_readings/current_power_limit``
in the 530s), so each value is looked up under every name it has had.
Compute capability is not in the report of every driver; ``parse_compute_caps``
reads it from ``nvidia-smi --query-gpu=pci.bus_id,compute_cap --format=csv,noheader``.

Stdlib only: Ansible ships this file to hosts as ``ansible.module_utils.gpu_smi``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET  # parses the local driver's own report, not untrusted input
from typing import Any

SMI_XML_ARGV = ("nvidia-smi", "-q", "-x")
SMI_COMPUTE_CAP_ARGV = ("nvidia-smi", "--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader")
_MISSING = ("", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]", "none")
_NUMBER = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)")


class SmiParseError(ValueError):
    """The text is not an nvidia-smi XML report."""


def _text(node: ET.Element | None, *paths: str) -> str | None:
    """The first non-missing text found under any of the paths."""
    if node is None:
        return None
    for path in paths:
        found = node.find(path)
        if found is not None and found.text is not None and found.text.strip().lower() not in _MISSING:
            return found.text.strip()
    return None


def _number(text: str | None) -> float | None:
    """The leading number of '700.00 W', '1980 MHz', '34 C', '143771 MiB'; None when missing."""
    if text is None:
        return None
    match = _NUMBER.match(text)
    return float(match.group(1)) if match else None


def _int(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value)


def _ecc_uncorrected(gpu: ET.Element) -> int | None:
    """Uncorrected ECC errors since the driver loaded, summed over the report's counters."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    total, seen = 0, False
    for node in volatile.iter():
        name = node.tag.lower()
        if node is volatile or "uncorr" not in name or node.text is None:
            continue
        value = _int(node.text)
        if value is not None:
            total += value
            seen = True
    return total if seen else None


def _gpu(gpu: ET.Element, index: int) -> dict[str, Any]:
    bus_id = _text(gpu, "pci/pci_bus_id") or gpu.get("id")
    minor = _int(_text(gpu, "minor_number"))
    return {
        "index": index,
        "minor_number": minor,
        "name": _text(gpu, "product_name"),
        "uuid": _text(gpu, "uuid"),
        "pci_bus_id": bus_id,
        "compute_capability": _text(gpu, "compute_capability", "cuda_compute_capability"),
        "memory_total_mib": _int(_text(gpu, "fb_memory_usage/total")),
        "memory_used_mib": _int(_text(gpu, "fb_memory_usage/used")),
        "memory_free_mib": _int(_text(gpu, "fb_memory_usage/free")),
        "mig_mode": _text(gpu, "mig_mode/current_mig"),
        "persistence_mode": _text(gpu, "persistence_mode"),
        "display_active": _text(gpu, "display_active"),
        "clocks": {
            "graphics_mhz": _int(_text(gpu, "clocks/graphics_clock")),
            "sm_mhz": _int(_text(gpu, "clocks/sm_clock")),
            "memory_mhz": _int(_text(gpu, "clocks/mem_clock")),
            "sm_max_mhz": _int(_text(gpu, "max_clocks/sm_clock")),
            "memory_max_mhz": _int(_text(gpu, "max_clocks/mem_clock")),
        },
        "power_limit_w": _number(
            _text(gpu, "gpu_power_readings/current_power_limit", "power_readings/power_limit",
                  "gpu_power_readings/enforced_power_limit", "power_readings/enforced_power_limit")
        ),
        "power_draw_w": _number(
            _text(gpu, "gpu_power_readings/power_draw", "gpu_power_readings/instant_power_draw",
                  "power_readings/power_draw")
        ),
        "temperature_c": _int(_text(gpu, "temperature/gpu_temp")),
        "ecc": {
            "current": _text(gpu, "ecc_mode/current_ecc"),
            "pending": _text(gpu, "ecc_mode/pending_ecc"),
            "uncorrected_volatile": _ecc_uncorrected(gpu),
        },
    }


def _processes(gpu: ET.Element, facts: dict[str, Any]) -> list[dict[str, Any]]:
    result = []
    for process in gpu.findall("processes/process_info"):
        pid = _int(_text(process, "pid"))
        if pid is None:
            continue
        result.append(
            {
                "gpu_index": facts["index"],
                "gpu_uuid": facts["uuid"],
                "pid": pid,
                "name": _text(process, "process_name"),
                "type": _text(process, "type"),
                "used_memory_mib": _int(_text(process, "used_memory")),
            }
        )
    return result


def parse_smi_xml(text: str) -> dict[str, Any]:
    """GPU facts from the text of ``nvidia-smi -q -x``; SmiParseError when it is not such a report."""
    # The report starts with a DOCTYPE naming a DTD file; ElementTree ignores it
    # and fetches nothing.
    try:
        root = ET.fromstring(text)  # noqa: S314 - see the import
    except ET.ParseError as error:
        raise SmiParseError(f"nvidia-smi -q -x did not print XML: {error}") from error
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"nvidia-smi -q -x printed <{root.tag}>, not <nvidia_smi_log>")
    gpus: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    # nvidia-smi lists GPUs in PCI bus order, which is its own numbering
    # (and CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID).
    for index, node in enumerate(root.findall("gpu")):
        facts = _gpu(node, index)
        gpus.append(facts)
        processes.extend(_processes(node, facts))
    return {
        "source": "nvidia-smi",
        "driver_version": _text(root, "driver_version"),
        "cuda_driver_version": _text(root, "cuda_version"),
        "gpus": gpus,
        "processes": processes,
    }


def parse_compute_caps(text: str) -> dict[str, str]:
    """PCI bus id -> compute capability from ``--query-gpu=pci.bus_id,compute_cap --format=csv,noheader``."""
    caps = {}
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 2 and re.match(r"^[0-9]+\.[0-9]+$", fields[1]):
            caps[fields[0].lower()] = fields[1]
    return caps


def add_compute_caps(facts: dict[str, Any], caps: dict[str, str]) -> dict[str, Any]:
    """Fill in the compute capability the XML lacked, matching GPUs by PCI bus id."""
    for gpu in facts["gpus"]:
        if gpu.get("compute_capability") is None and gpu.get("pci_bus_id"):
            gpu["compute_capability"] = caps.get(str(gpu["pci_bus_id"]).lower())
    return facts
