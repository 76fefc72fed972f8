"""What an operator notices on a host after the nvidia_driver role ran.

The packages are llmfleet STAND-INs (files/standins/, NOT NVIDIA's packages)
with Debian 12's real names and versions; the repository also offers the newer
535.309.01-0+deb12u1 from bookworm-security, so the pin and the hold are what
keep 535.261.03-1. Values are converge.yml's.
"""

from __future__ import annotations

import pytest

PINNED = {
    "nvidia-driver": "535.261.03-1",
    "nvidia-kernel-dkms": "535.261.03-1",
    "nvidia-smi": "535.261.03-1",
}
# Debian's nvidia-persistenced (contrib) has its own version.
COMPANIONS = {"nvidia-persistenced": "535.171.04-1~deb12u1"}
NEWER = "535.309.01-0+deb12u1"
PIN_FILE = "/etc/apt/preferences.d/llmfleet-nvidia-driver"
MARKER = "/var/lib/llmfleet/nvidia-driver-reboot-required"


@pytest.mark.parametrize(("name", "version"), {**PINNED, **COMPANIONS}.items())
def test_package_is_installed_at_the_pinned_version(host, name, version):
    package = host.package(name)
    assert package.is_installed
    assert package.version == version


@pytest.mark.parametrize("name", [*PINNED, *COMPANIONS])
def test_package_is_held(host, name):
    assert host.check_output(f"dpkg-query -W -f='${{Status}}' {name}").startswith("hold ")


def test_packages_are_stand_ins(host):
    # The lab never mistakes these for NVIDIA's packages.
    for name in [*PINNED, *COMPANIONS]:
        assert "llmfleet STAND-IN" in host.check_output(f"dpkg-query -W -f='${{Description}}' {name}")


def test_dkms_is_installed(host):
    assert host.package("dkms").is_installed


def test_pin_file_pins_the_driver_version(host):
    pin = host.file(PIN_FILE)
    assert pin.exists
    assert pin.mode == 0o644
    content = pin.content_string
    assert "Package: nvidia-driver nvidia-kernel-dkms nvidia-smi\n" in content
    assert "Pin: version 535.261.03-*\n" in content
    assert "Pin-Priority: 1001\n" in content


def test_pin_wins_over_the_newer_version(host):
    policy = host.check_output("apt-cache policy nvidia-driver")
    assert NEWER in policy, "the repository must offer the newer version, or this test proves nothing"
    assert "Candidate: 535.261.03-1" in policy


def test_upgrade_leaves_the_driver_alone(host):
    simulated = host.check_output("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert "Inst nvidia" not in simulated


def test_repository_is_configured(host):
    sources = host.file("/etc/apt/sources.list.d/llmfleet-nvidia-cuda.list")
    assert sources.exists
    assert "deb [trusted=yes] file:/srv/llmfleet-standins ./" in sources.content_string


def test_nouveau_is_blacklisted(host):
    blacklist = host.file("/etc/modprobe.d/llmfleet-blacklist-nouveau.conf")
    assert blacklist.exists
    lines = blacklist.content_string.splitlines()
    assert "blacklist nouveau" in lines
    assert "options nouveau modeset=0" in lines


def test_persistence_daemon_runs(host):
    service = host.service("nvidia-persistenced")
    assert service.is_running
    assert service.is_enabled
    # The stand-in daemon's pid file, where the real one keeps it.
    assert host.file("/run/nvidia-persistenced/nvidia-persistenced.pid").exists


def test_nvidia_smi_reports_the_pinned_driver(host):
    result = host.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert result.rc == 0
    assert set(result.stdout.split()) == {"535.261.03"}
    assert "STAND-IN" in result.stderr


def test_reboot_is_recorded_as_required(host):
    # A container cannot reboot into a driver: the role records and reports it.
    marker = host.file(MARKER)
    assert marker.exists
    boot_id = host.file("/proc/sys/kernel/random/boot_id").content_string.strip()
    assert marker.content_string.startswith(f"boot_id={boot_id}\n")
    assert "reason=NVIDIA driver 535.261.03" in marker.content_string


def test_unattended_upgrades_leave_kernels_alone(host):
    # apt reads the blacklist the role wrote, as unattended-upgrades will.
    dumped = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    for pattern in ("^linux-image-", "^linux-headers-", "^linux-modules-"):
        assert f'"{pattern}";' in dumped
