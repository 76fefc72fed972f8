"""Filters that turn the preflight role's probe results into the data its checks judge.

They belong to the preflight role only (roles/preflight/tasks/evaluate.yml), so they
live in the role's filter_plugins rather than plugins/filter/. Each was a Jinja loop
in evaluate.yml; the keys, values and order they return are the same, because the
checks' messages (preflight_checks.py, beside this file) are built from them word for word.

    gpu_probe.processes | preflight_gpu_processes(engine_ids)
    gpu_probe | preflight_gpus(engine_ids)
    gpus | preflight_gpu_memory_gaps(gap_pct)
    df_probe.stdout_lines | preflight_df
    disk_requirements | preflight_disk(df)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

# df.sh prints "path<TAB>mount<TAB>available_kib<TAB>size_kib" per path.
_DF_FIELDS = 4
_KIB_PER_GIB = 1048576


def _list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise AnsibleFilterError(f"{name}: expected a list, got {type(value).__name__}")
    return list(value)


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{name}: expected a mapping, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    """Jinja's `int` filter: "42" and "42.5" give 42, anything else 0."""
    try:
        return int(value, 10) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0


def _is_engine(process: Mapping[str, Any], engine_ids: list[Any]) -> bool:
    container = process.get("container_id")
    return container is not None and container in engine_ids


def preflight_gpu_processes(processes: Any, engine_ids: Any) -> list[dict[str, Any]]:
    """Each process holding GPU memory (gpu_facts), with `engine`: whether it runs in one
    of the project's engine containers (their ids, `docker ps -q` lines)."""
    ids = _list(engine_ids, "preflight_gpu_processes engine_ids")
    return [
        {**_mapping(process, "preflight_gpu_processes process"), "engine": _is_engine(process, ids)}
        for process in _list(processes, "preflight_gpu_processes")
    ]


def preflight_gpus(gpu_probe: Any, engine_ids: Any) -> list[dict[str, Any]]:
    """One dict per GPU the gpu_facts module found, with the keys the checks and the report
    use; memory held by the engines' processes on it is memory_engine_mib."""
    probe = _mapping(gpu_probe, "preflight_gpus")
    ids = _list(engine_ids, "preflight_gpus engine_ids")
    processes = _list(probe.get("processes"), "preflight_gpus processes")
    gpus = []
    for gpu in _list(probe.get("gpus"), "preflight_gpus gpus"):
        try:
            engine = sum(
                process.get("used_memory_mib") or 0
                for process in processes
                if process.get("gpu_index") == gpu["index"] and process.get("container_id") in ids
            )
            gpus.append({
                "index": gpu["index"], "name": gpu["name"], "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"],
                "memory_total_mib": gpu["memory_total_mib"], "memory_used_mib": gpu["memory_used_mib"],
                "memory_free_mib": gpu["memory_free_mib"], "memory_engine_mib": engine,
                "display_active": gpu.get("display_active") or "N/A",
                "driver_version": probe["driver_version"],
                "compute_capability": gpu["compute_capability"],
            })
        except (KeyError, TypeError) as err:
            raise AnsibleFilterError(f"preflight_gpus: a GPU or the probe lacks {err}") from err
    return gpus


def preflight_gpu_memory_gaps(gpus: Any, gap_pct: Any) -> list[dict[str, Any]]:
    """The GPUs whose free memory is more than gap_pct percent below that of their freest
    sibling (another GPU of the same model). Memory the engines hold counts as free."""
    available = [
        {**gpu, "memory_free_mib": gpu["memory_free_mib"] + gpu["memory_engine_mib"]}
        for gpu in _list(gpus, "preflight_gpu_memory_gaps")
    ]
    gaps = []
    for gpu in available:
        siblings = [other for other in available if other["index"] != gpu["index"] and other["name"] == gpu["name"]]
        if not siblings:
            continue
        # The last of the freest, as Jinja's stable sort(attribute=...) | last picks.
        freest = sorted(siblings, key=lambda sibling: sibling["memory_free_mib"])[-1]
        gap = freest["memory_free_mib"] - gpu["memory_free_mib"]
        if freest["memory_free_mib"] > 0 and gap * 100 > gap_pct * freest["memory_free_mib"]:
            gaps.append({
                "index": gpu["index"], "name": gpu["name"], "total": gpu["memory_total_mib"],
                "used": gpu["memory_used_mib"], "free": gpu["memory_free_mib"], "display": gpu["display_active"],
                "sibling": freest["index"], "sibling_free": freest["memory_free_mib"], "gap": gap,
                "gap_pct": round(gap * 100 / freest["memory_free_mib"], 1),
            })
    return gaps


def preflight_df(lines: Any) -> dict[str, dict[str, Any]]:
    """files/df.sh's lines as {path: {mount, available_kib, size_kib}}; other lines are skipped."""
    entries = {}
    for line in _list(lines, "preflight_df"):
        if line.count("\t") != _DF_FIELDS - 1:
            continue
        path, mount, available, size = line.split("\t")
        entries[path] = {"mount": mount, "available_kib": _int(available), "size_kib": _int(size)}
    return entries


def preflight_disk(requirements: Any, df: Any) -> list[dict[str, Any]]:
    """The disk requirements added up per filesystem (a path df did not report is left out):
    {mount, available_gib, needed_gib, uses, short} per filesystem, in the order first met."""
    found = _mapping(df, "preflight_disk df")
    filesystems: dict[str, dict[str, Any]] = {}
    for requirement in _list(requirements, "preflight_disk"):
        if requirement["path"] not in found:
            continue
        entry = found[requirement["path"]]
        filesystem = filesystems.setdefault(entry["mount"], {
            "mount": entry["mount"], "available_gib": round(entry["available_kib"] / _KIB_PER_GIB, 1),
            "needed_gib": 0, "uses": [],
        })
        purpose = requirement.get("purpose", requirement["path"])
        filesystem["needed_gib"] = filesystem["needed_gib"] + requirement["min_gib"]
        filesystem["uses"] = [*filesystem["uses"], f"{purpose} in {requirement['path']} {requirement['min_gib']} GiB"]
    return [{**entry, "short": entry["available_gib"] < entry["needed_gib"]} for entry in filesystems.values()]


class FilterModule:
    """The preflight role's probe filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "preflight_gpu_processes": preflight_gpu_processes,
            "preflight_gpus": preflight_gpus,
            "preflight_gpu_memory_gaps": preflight_gpu_memory_gaps,
            "preflight_df": preflight_df,
            "preflight_disk": preflight_disk,
        }
