"""The Debian 12 systemd base image: debootstrap + `docker import`, never pulled. The lab's hosts, the
Molecule scenarios and the engine and service images (llmfleet.build.images) all start from it.

The image is tagged with a content key: a hash of everything that shapes the
root filesystem (suite, package list, mirror, recipe version). A built key is
reused; a changed recipe gets a new tag. `:latest` points at the newest build
for the Molecule scenarios.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from llmfleet.build.docker_engine import docker
from llmfleet.errors import LlmfleetError
from llmfleet.paths import cache_dir, exclusive_build

log = logging.getLogger(__name__)

IMAGE_REPOSITORY = "llmfleet-lab/debian12-systemd"
SUITE = "bookworm"
# Bump when the rootfs preparation below changes: it is part of the content key.
RECIPE_VERSION = "4"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-apt",
    "sudo",
    # Ansible reaches lab hosts over SSH as an unprivileged user with sudo, as on a real site (llmfleet.lab.ssh).
    "openssh-server",
    "iproute2",
    "ca-certificates",
    "gnupg",
    "procps",
    "less",
)
# Units that need hardware or a console a container does not have: left
# enabled they fail and `systemctl is-system-running` reports "degraded".
MASKED_UNITS = (
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
    "systemd-modules-load.service",
    "getty@tty1.service",
    "console-getty.service",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "dev-hugepages.mount",
    "systemd-remount-fs.service",
    "systemd-firstboot.service",
)
MIRROR_ENV = "LLMFLEET_DEBIAN_MIRROR"


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt already uses for SUITE.

    Read from apt's own configuration so the project never names a mirror;
    LLMFLEET_DEBIAN_MIRROR overrides it (needed on Ubuntu build machines).
    """
    if os.environ.get(MIRROR_ENV):
        return os.environ[MIRROR_ENV].rstrip("/")
    for sources in sorted(apt_dir.glob("sources.list.d/*.sources")):
        for stanza in sources.read_text().split("\n\n"):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, re.MULTILINE))
            if SUITE in fields.get("Suites", "").split():
                return str(fields["URIs"]).split()[0].rstrip("/")
    lists = [apt_dir / "sources.list", *sorted(apt_dir.glob("sources.list.d/*.list"))]
    for path in lists:
        if path.is_file():
            for match in re.finditer(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", path.read_text(), re.M):
                return match.group(1).rstrip("/")
    raise LlmfleetError(f"no Debian {SUITE} mirror in /etc/apt: set {MIRROR_ENV} to a Debian mirror URL")


def content_key(mirror: str) -> str:
    recipe = json.dumps(
        {"suite": SUITE, "packages": PACKAGES, "masked": MASKED_UNITS, "mirror": mirror, "recipe": RECIPE_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def image_exists(reference: str) -> bool:
    return docker("image", "inspect", reference, check=False).returncode == 0


def ensure_base_image() -> str:
    """Return the image reference, building it only when its key is new."""
    mirror = debian_mirror()
    reference = f"{IMAGE_REPOSITORY}:{content_key(mirror)}"
    images = cache_dir() / "images"
    images.mkdir(parents=True, exist_ok=True)
    # One builder at a time: scripts/test.sh runs `lab prepare roles` and `lab prepare engines` side by side.
    with exclusive_build(images / ".debian12-systemd.lock", "the lab base image"):
        if not image_exists(reference):
            archive = images / f"debian12-systemd-{content_key(mirror)}.tar"
            if not archive.is_file():
                _build_rootfs_archive(mirror, archive)
            _import(archive, reference)
        docker("tag", reference, f"{IMAGE_REPOSITORY}:latest")
    return reference


def _build_rootfs_archive(mirror: str, archive: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise LlmfleetError("debootstrap is missing: apt-get install debootstrap")
    archive.parent.mkdir(parents=True, exist_ok=True)
    log.warning("Building the lab base image with debootstrap (about a minute)")
    with tempfile.TemporaryDirectory(dir=archive.parent) as work:
        rootfs = Path(work) / "rootfs"
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise LlmfleetError(f"debootstrap failed:\n{tail}")
        _prepare_rootfs(rootfs)
        partial = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True)
        # Rename only once complete, so a killed build never leaves a tarball that looks cached.
        partial.rename(archive)


def _prepare_rootfs(rootfs: Path) -> None:
    # An empty machine-id makes systemd generate a fresh one in every container.
    (rootfs / "etc/machine-id").write_text("")
    systemd_dir = rootfs / "etc/systemd/system"
    for unit in MASKED_UNITS:
        link = systemd_dir / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # Every container makes its own SSH host keys on first boot, instead of sharing the ones
    # the package made in the image; `sshd -t` then checks the configuration as the unit did.
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    drop_in = systemd_dir / "ssh.service.d"
    drop_in.mkdir(parents=True, exist_ok=True)
    (drop_in / "host-keys.conf").write_text(
        "[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n"
    )
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (rootfs / cache).glob("*"):
            if entry.is_file():
                entry.unlink()


def _import(archive: Path, reference: str) -> None:
    changes = [
        # docker import (20.10) refuses STOPSIGNAL: the lab sets --stop-signal on run.
        "ENV container=docker",
        'CMD ["/lib/systemd/systemd"]',
    ]
    args = ["docker", "import"]
    for change in changes:
        args += ["--change", change]
    with archive.open("rb") as stream:
        result = subprocess.run([*args, "-", reference], stdin=stream, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LlmfleetError(f"docker import failed: {result.stderr.strip()}")
