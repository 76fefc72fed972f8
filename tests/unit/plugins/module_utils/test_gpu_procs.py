"""plugins/module_utils/gpu_procs.py: the container a GPU process runs in, from /proc/PID/cgroup."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.module_utils import gpu_procs

ID = "4f1c2a3b" * 8


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (f"0::/system.slice/docker-{ID}.scope\n", ID),  # cgroup v2, systemd driver
        (f"12:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n", ID),  # cgroup v1
        (f"0::/system.slice/containerd.service/kubepods-besteffort.slice:cri-containerd:{ID}\n", ID),
        ("0::/user.slice/user-0.slice/session-3.scope\n", None),  # a process on the host
        ("0::/\n", None),
    ],
    ids=["v2", "v1", "containerd", "host", "root"],
)
def test_container_id_from_cgroup(cgroup: str, expected: str | None) -> None:
    assert gpu_procs.container_id_from_cgroup(cgroup) == expected


def test_processes_get_their_container_and_command_line(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{ID}.scope\n")
    (tmp_path / "4242" / "cmdline").write_bytes(b"python3\0-m\0vllm.entrypoints.openai.api_server\0")
    processes = [{"pid": 4242, "gpu_index": 0}, {"pid": 4343, "gpu_index": 1}]  # 4343 has gone
    described = gpu_procs.describe_processes(processes, proc_root=str(tmp_path))
    assert described[0]["container_id"] == ID
    assert described[0]["cmdline"] == "python3 -m vllm.entrypoints.openai.api_server"
    assert described[1]["container_id"] is None and described[1]["cmdline"] is None
