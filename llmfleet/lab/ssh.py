"""How Ansible reaches lab hosts: over SSH, as an unprivileged user with sudo.

A real site is reached that way (production.example's ansible_user and
ansible_become), so a task that forgot `become`, or a file written with the
wrong owner, fails in the lab as it would there. `llmfleet lab up` makes one
key pair per lab, creates the user on every host with the public key and
password-less sudo (what a site's own provisioning gives it), and writes the
hosts' keys to a known_hosts file, so host keys are checked, not ignored.
The lab inventory names both files (inventories/lab/group_vars/all/lab.yml).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from llmfleet.build.docker_engine import docker
from llmfleet.errors import LlmfleetError
from llmfleet.lab.topology import Lab, LabHost
from llmfleet.paths import cache_dir

__all__ = ["authorize", "ssh_dir"]

# The user's account on each host: created when absent, its key and sudo rule rewritten every time.
_GRANT = r"""set -eu
user="$1"
id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
home=$(getent passwd "$user" | cut -d: -f6)
install -d -m 0700 -o "$user" -g "$user" "$home/.ssh"
cat > "$home/.ssh/authorized_keys"
chown "$user:$user" "$home/.ssh/authorized_keys"
chmod 0600 "$home/.ssh/authorized_keys"
printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$user" > "/etc/sudoers.d/50-$user"
chmod 0440 "/etc/sudoers.d/50-$user"
visudo -cq
"""
_HOST_KEY = "/etc/ssh/ssh_host_ed25519_key.pub"


def ssh_dir(lab: Lab) -> Path:
    """Where the lab's key pair and known_hosts live, beside the lab's other cached parts."""
    return cache_dir() / "lab" / lab.name / "ssh"


def authorize(lab: Lab) -> None:
    """Give every host the lab's user and key, and record every host's key; run again, it changes nothing."""
    directory = ssh_dir(lab)
    public_key = _ensure_key_pair(directory)
    known_hosts = []
    for host in lab.hosts:
        _grant(host, lab.ssh_user, public_key)
        known_hosts.append(f"{host.address} {_host_key(host)}")
    # Written whole each time: a recreated host has a new key, and a stale line would refuse it.
    partial = directory / "known_hosts.partial"
    partial.write_text("\n".join(known_hosts) + "\n")
    partial.replace(directory / "known_hosts")


def _ensure_key_pair(directory: Path) -> str:
    key = directory / "id_ed25519"
    if not key.is_file():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        result = subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"llmfleet-lab@{directory.parent.name}",
             "-f", str(key)],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise LlmfleetError(f"ssh-keygen failed: {result.stderr.strip()}")
    return (directory / "id_ed25519.pub").read_text()


def _grant(host: LabHost, user: str, public_key: str) -> None:
    result = subprocess.run(
        ["docker", "exec", "-i", host.container, "sh", "-c", _GRANT, "grant", user],
        input=public_key, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise LlmfleetError(f"{host.name}: giving user {user} the lab's SSH key failed: {result.stderr.strip()}")


def _host_key(host: LabHost) -> str:
    # ssh.service makes the host keys before sshd starts; systemd is "running" by now, so they exist.
    key = docker("exec", host.container, "cat", _HOST_KEY, check=False)
    if key.returncode != 0 or not re.fullmatch(r"ssh-ed25519 \S+( \S+)?\n?", key.stdout):
        raise LlmfleetError(
            f"{host.name}: no SSH host key at {_HOST_KEY} ({key.stderr.strip() or key.stdout.strip()}); "
            f"see `docker exec {host.container} systemctl status ssh`"
        )
    return " ".join(key.stdout.split()[:2])
