"""Which container a process holding GPU memory runs in, read from /proc.

NVML and nvidia-smi report host PIDs. A vLLM engine of the ``vllm`` role runs
in a Docker container, so its PID's cgroup names the container's 64-hex id
(cgroup v2 ``/system.slice/docker-<id>.scope``, cgroup v1 ``/docker/<id>``);
preflight compares that id with the ids of the containers labelled
``llmfleet.role=vllm`` to tell the project's own engines from a stray process.

Stdlib only: Ansible ships this file to hosts as ``ansible.module_utils.gpu_procs``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_CONTAINER_ID = re.compile(r"(?:docker|containerd|cri-containerd|libpod|crio)[-/:]([0-9a-f]{64})(?:\.scope)?\b")


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in the text of /proc/PID/cgroup, or None for a process on the host."""
    for line in text.splitlines():
        match = _CONTAINER_ID.search(line)
        if match:
            return match.group(1)
    return None


def describe_processes(processes: list[dict[str, Any]], proc_root: str = "/proc") -> list[dict[str, Any]]:
    """The processes with their container id and command line, where /proc still has them."""
    result = []
    for process in processes:
        entry = dict(process)
        base = Path(proc_root) / str(process["pid"])
        try:
            entry["container_id"] = container_id_from_cgroup((base / "cgroup").read_text(encoding="utf-8"))
        except OSError:
            entry["container_id"] = None
        try:
            raw = (base / "cmdline").read_bytes()
            entry["cmdline"] = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:300]
        except OSError:
            entry["cmdline"] = None
        result.append(entry)
    return result
