"""Lab hosts as systemd containers on one dedicated Docker network.

`up` is idempotent: it creates what is missing, starts what is stopped and
leaves running hosts alone. `down` removes exactly what carries the lab label.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from llmfleet.build.docker_engine import docker
from llmfleet.errors import LlmfleetError
from llmfleet.lab import standin_pci
from llmfleet.lab.topology import Lab, LabHost

__all__ = ["HostStatus", "Lab", "deliver_archive", "down", "status", "up", "wait_for_systemd"]

log = logging.getLogger(__name__)

# NOTES.md: `--privileged` is refused on the build machines (SYS_RESOURCE lies
# outside the bounding set), so grant every other capability explicitly.
SYSTEMD_RUN_FLAGS = (
    "--cap-add",
    "ALL",
    "--cap-drop",
    "SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--cgroupns=host",
    "--volume",
    "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs",
    "/run",
    "--tmpfs",
    "/run/lock",
    "--stop-signal",
    "SIGRTMIN+3",
    # A real host's /dev/shm is half its memory; Docker's 64 MB default would fail preflight.
    "--shm-size",
    "2g",
)
BOOT_DEADLINE = 120.0


@dataclass(frozen=True)
class HostStatus:
    host: LabHost
    state: str  # docker's container state, or "absent"
    systemd: str  # `systemctl is-system-running`, or "-" when not running


def up(lab: Lab, image: str) -> None:
    _ensure_network(lab)
    for host in lab.hosts:
        state = _container_state(host)
        if state == "absent":
            _create(lab, host, image)
        elif state != "running":
            docker("start", host.container)
    for host in lab.hosts:
        wait_for_systemd(host)


def deliver_archive(host: LabHost, archive: Path, destination: str) -> None:
    """Unpack a .tar.gz from the controller into a directory on the host."""
    with archive.open("rb") as stream:
        result = subprocess.run(
            [
                "docker",
                "exec",
                "-i",
                host.container,
                "sh",
                "-c",
                f"mkdir -p '{destination}' && tar -xzf - -C '{destination}'",
            ],
            stdin=stream,
            capture_output=True,
            check=False,
        )
    if result.returncode != 0:
        raise LlmfleetError(f"{host.name}: unpacking {archive.name} failed: {result.stderr.decode().strip()}")


def down(lab: Lab) -> list[str]:
    """Remove the lab's containers, volumes and network; return what went."""
    label = f"label={lab.label}"
    removed: list[str] = []
    containers = docker("ps", "-aq", "--filter", label).stdout.split()
    if containers:
        docker("rm", "-f", "-v", *containers)
        removed += [f"container {c}" for c in containers]
    volumes = docker("volume", "ls", "-q", "--filter", label).stdout.split()
    if volumes:
        docker("volume", "rm", *volumes)
        removed += [f"volume {v}" for v in volumes]
    networks = docker("network", "ls", "-q", "--filter", label).stdout.split()
    if networks:
        docker("network", "rm", *networks)
        removed += [f"network {n}" for n in networks]
    return removed


def status(lab: Lab) -> list[HostStatus]:
    result = []
    for host in lab.hosts:
        state = _container_state(host)
        systemd = "-"
        if state == "running":
            probe = docker("exec", host.container, "systemctl", "is-system-running", check=False)
            systemd = probe.stdout.strip() or "starting"
        result.append(HostStatus(host, state, systemd))
    return result


def wait_for_systemd(host: LabHost, deadline_s: float = BOOT_DEADLINE) -> None:
    """Wait until systemd inside the host reports "running"; fail on "degraded"."""
    deadline = time.monotonic() + deadline_s
    while True:
        remaining = max(1, int(deadline - time.monotonic()))
        # --wait blocks while systemd is starting; before systemd's bus exists it
        # fails at once, which is why this loops until the deadline.
        probe = subprocess.run(
            ["docker", "exec", host.container, "timeout", str(remaining), "systemctl", "is-system-running", "--wait"],
            capture_output=True,
            text=True,
            check=False,
        )
        state = probe.stdout.strip()
        if state == "running":
            return
        if state == "degraded":
            failed = docker("exec", host.container, "systemctl", "--failed", "--no-legend", check=False).stdout.strip()
            raise LlmfleetError(f"{host.name}: systemd is degraded; failed units:\n{failed}")
        if time.monotonic() > deadline:
            raise LlmfleetError(
                f"{host.name}: systemd not running after {deadline_s:.0f}s "
                f"(state: {state or probe.stderr.strip()}); see `docker logs {host.container}`"
            )
        time.sleep(0.5)


def _ensure_network(lab: Lab) -> None:
    probe = docker("network", "inspect", lab.network, check=False)
    if probe.returncode == 0:
        subnets = [c["Subnet"] for c in json.loads(probe.stdout)[0]["IPAM"]["Config"] or []]
        if lab.subnet not in subnets:
            raise LlmfleetError(
                f"network {lab.network} exists with subnets {subnets}, not {lab.subnet}: run `llmfleet lab down` first"
            )
        return
    docker("network", "create", "--label", lab.label, "--subnet", lab.subnet, lab.network)


def _container_state(host: LabHost) -> str:
    probe = docker("inspect", "--format", "{{.State.Status}}", host.container, check=False)
    return probe.stdout.strip() if probe.returncode == 0 else "absent"


def _create(lab: Lab, host: LabHost, image: str) -> None:
    log.info("Creating lab host %s (%s)", host.name, host.address)
    docker("volume", "create", "--label", lab.label, host.docker_volume)
    # The STAND-IN PCI listing with NVSwitches, read-only over the host's own PCI devices.
    pci = ["--volume", f"{standin_pci.ensure_tree()}:{standin_pci.MOUNT_POINT}:ro"] if host.standin_pci else []
    docker(
        "run",
        "--detach",
        "--name",
        host.container,
        "--hostname",
        host.name,
        "--label",
        lab.label,
        "--network",
        lab.network,
        "--ip",
        host.address,
        "--volume",
        f"{host.docker_volume}:/var/lib/docker",
        *pci,
        *SYSTEMD_RUN_FLAGS,
        image,
    )
