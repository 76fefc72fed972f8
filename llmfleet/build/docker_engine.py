"""The local Docker engine the lab and the image builds run on: installed and started when absent."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from pathlib import Path

from llmfleet.errors import LlmfleetError

log = logging.getLogger(__name__)

DOCKERD_LOG = Path("/var/log/llmfleet-dockerd.log")
# Seconds dockerd gets to answer `docker info` after start; it takes a few here.
DOCKERD_START_DEADLINE = 60.0


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI; on failure raise with docker's own message."""
    result = subprocess.run(["docker", *args], check=False, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise LlmfleetError(f"`docker {' '.join(args[:3])} ...` failed: {result.stderr.strip()}")
    return result


def engine_running() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def ensure_engine() -> None:
    """Make `docker info` succeed: install docker.io from the distro, start dockerd.

    On a host with systemd the package's unit starts it; on a build machine or
    container without systemd as PID 1 we start dockerd ourselves in the
    background, logging to DOCKERD_LOG.
    """
    if engine_running():
        return
    if shutil.which("dockerd") is None:
        log.warning("Docker engine not found: installing docker.io from the distribution")
        _apt_install("docker.io")
    if _systemd_is_pid1():
        subprocess.run(["systemctl", "start", "docker"], check=False)
    else:
        log.warning("Starting dockerd in the background (log: %s)", DOCKERD_LOG)
        with DOCKERD_LOG.open("ab") as out:
            subprocess.Popen(["dockerd"], stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + DOCKERD_START_DEADLINE
    while not engine_running():
        if time.monotonic() > deadline:
            raise LlmfleetError(f"dockerd did not answer within {DOCKERD_START_DEADLINE:.0f}s; see {DOCKERD_LOG}")
        time.sleep(0.5)


def _systemd_is_pid1() -> bool:
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def _apt_install(*packages: str) -> None:
    env_cmd = ["env", "DEBIAN_FRONTEND=noninteractive"]
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        if subprocess.run([*env_cmd, *cmd], check=False).returncode != 0:
            raise LlmfleetError(f"`{' '.join(cmd)}` failed: install {' '.join(packages)} by hand (needs root)")
