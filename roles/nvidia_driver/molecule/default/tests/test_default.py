"""What an operator notices on a host after the nvidia_driver role ran.

The packages are llmfleet STAND-INs (files/standins/, NOT NVIDIA's packages)
with Debian 12's real names and versions; the repository also offers the newer
535.309.01-0+deb12u1 from bookworm-security, so the pin and the hold are what
keep 535.261.03-1. Values are converge.yml's. The host's PCI bus is a STAND-IN
listing with four NVSwitches (prepare.yml), so the role installed NVIDIA Fabric
Manager (stand-ins of NVIDIA's repository's packages) at the driver's version;
side_effect.yml has provoked and undone the faults before these run, and has
switched the host from the open kernel modules converge installed to the
proprietary ones these tests find.
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
# NVIDIA Fabric Manager and NSCQ, at the driver's version exactly; the stand-in
# repository also offers 535.274.02-1, which the pin must refuse.
FABRIC_MANAGER = {"nvidia-fabricmanager-535": "535.261.03-1", "libnvidia-nscq-535": "535.261.03-1"}
FM_PIN_FILE = "/etc/apt/preferences.d/llmfleet-nvidia-fabricmanager"
PERSISTENCE_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/90-llmfleet-persistence-mode.conf"
MARKER = "/var/lib/llmfleet/nvidia-driver-reboot-required"


@pytest.mark.parametrize(("name", "version"), {**PINNED, **COMPANIONS, **FABRIC_MANAGER}.items())
def test_package_is_installed_at_the_pinned_version(host, name, version):
    package = host.package(name)
    assert package.is_installed
    assert package.version == version


@pytest.mark.parametrize("name", [*PINNED, *COMPANIONS, *FABRIC_MANAGER])
def test_package_is_held(host, name):
    assert host.check_output(f"dpkg-query -W -f='${{Status}}' {name}").startswith("hold ")


def test_packages_are_stand_ins(host):
    # The lab never mistakes these for NVIDIA's packages.
    for name in [*PINNED, *COMPANIONS, *FABRIC_MANAGER]:
        assert "llmfleet STAND-IN" in host.check_output(f"dpkg-query -W -f='${{Description}}' {name}")


def test_the_other_flavour_of_kernel_module_is_gone(host):
    # converge installed nvidia-open-kernel-dkms; the switch to the proprietary modules removed it, so one DKMS
    # module builds nvidia.ko.
    assert not host.package("nvidia-open-kernel-dkms").is_installed


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


def test_the_pci_bus_is_the_stand_in_listing_with_nvswitches(host):
    # What the role detected Fabric Manager's need from (prepare.yml), labelled as a stand-in at its source.
    classes = host.check_output("cat /sys/bus/pci/devices/*/class").split()
    assert classes.count("0x068000") == 4
    assert host.file("/srv/llmfleet-standins-pci/0000:05:00.0/device").content_string.strip() == "0x22a3"


def test_fabric_manager_pin_file_pins_the_drivers_version(host):
    pin = host.file(FM_PIN_FILE)
    assert pin.exists
    assert pin.mode == 0o644
    content = pin.content_string
    assert "Package: nvidia-fabricmanager-535 libnvidia-nscq-535\n" in content
    assert "Pin: version 535.261.03-*\n" in content
    assert "Pin-Priority: 1001\n" in content


def test_fabric_manager_pin_wins_over_the_newer_release(host):
    policy = host.check_output("apt-cache policy nvidia-fabricmanager-535")
    assert "535.274.02-1" in policy, "the repository must offer another version, or this test proves nothing"
    assert "Candidate: 535.261.03-1" in policy


def test_fabric_manager_runs_with_the_driver_of_its_version(host):
    service = host.service("nvidia-fabricmanager")
    assert service.is_running
    assert service.is_enabled
    assert host.file("/run/nvidia-fabricmanager/nv-fabricmanager.pid").exists
    journal = host.check_output("journalctl --unit nvidia-fabricmanager --no-pager --output cat")
    assert "llmfleet STAND-IN nv-fabricmanager 535.261.03: started with driver 535.261.03" in journal


def test_persistence_daemon_runs_the_units_line_in_persistence_mode(host):
    dropin = host.file(PERSISTENCE_DROPIN)
    assert dropin.exists
    assert dropin.mode == 0o644
    # Debian's unit (the stand-in carries its ExecStart) with --persistence-mode added.
    line = "ExecStart=/usr/bin/nvidia-persistenced --user nvpd --persistence-mode"
    assert f"\nExecStart=\n{line}\n" in dropin.content_string
    shown = host.check_output("systemctl show --property=ExecStart --value nvidia-persistenced")
    assert "argv[]=/usr/bin/nvidia-persistenced --user nvpd --persistence-mode " in shown
    # side_effect.yml's --no-persistence-mode drop-in is gone.
    directory, name = PERSISTENCE_DROPIN.rsplit("/", 1)
    assert host.check_output(f"ls {directory}").split() == [name]


def test_every_gpu_is_in_persistence_mode(host):
    result = host.run("nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader")
    assert result.rc == 0
    assert result.stdout.splitlines() == ["0, Enabled", "1, Enabled"]


def test_the_drivers_library_is_at_the_drivers_version_and_held(host):
    # nvidia-smi depends on libnvidia-ml1 (= its version): without the set's
    # pin, the newer library would be apt's candidate and the install would stop.
    installed = host.check_output("dpkg-query -W -f='${Version} ${Status}' libnvidia-ml1")
    assert installed == "535.261.03-1 hold ok installed"
    policy = host.check_output("apt-cache policy libnvidia-ml1")
    assert NEWER in policy, "the repository must offer a newer library, or this test proves nothing"
    assert "Candidate: 535.261.03-1" in policy


def test_pin_file_pins_the_drivers_whole_set(host):
    content = host.file(PIN_FILE).content_string
    assert "Package: *nvidia* libcuda[0-9]* libnvcuvid[0-9]* libnvoptix[0-9]*\nPin: version 535.261.03-*\n" in content


def test_the_library_moved_by_hand_in_the_side_effect_is_gone(host):
    assert not host.package("libnvidia-encode1").is_installed
