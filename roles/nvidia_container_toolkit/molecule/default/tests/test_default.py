"""What an operator notices on a host after the nvidia_container_toolkit role ran.

The packages are llmfleet STAND-INs (files/standins/, NOT NVIDIA's packages)
with NVIDIA's names and versions; the repository also offers the newer 1.19.1,
so the pin and the hold are what keep 1.18.2. CDI generation is on
(converge.yml).
"""

from __future__ import annotations

import pytest
import yaml

VERSION = "1.18.2-1"
PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_is_installed_at_the_pinned_release(host, name):
    package = host.package(name)
    assert package.is_installed
    assert package.version == VERSION
    assert "llmfleet STAND-IN" in host.check_output(f"dpkg-query -W -f='${{Description}}' {name}")


@pytest.mark.parametrize("name", PACKAGES)
def test_package_is_held(host, name):
    assert host.check_output(f"dpkg-query -W -f='${{Status}}' {name}").startswith("hold ")


def test_pin_wins_over_the_newer_release(host):
    pin = host.file("/etc/apt/preferences.d/llmfleet-nvidia-container-toolkit")
    assert pin.exists
    assert "Pin: version 1.18.2-*\n" in pin.content_string
    policy = host.check_output("apt-cache policy nvidia-container-toolkit")
    assert "1.19.1-1" in policy, "the repository must offer the newer release, or this test proves nothing"
    assert "Candidate: 1.18.2-1" in policy


def test_repository_is_configured(host):
    sources = host.file("/etc/apt/sources.list.d/llmfleet-nvidia-container-toolkit.list")
    assert "deb [trusted=yes] file:/srv/llmfleet-standins ./" in sources.content_string


def test_nvidia_ctk_reports_the_release(host):
    assert "version 1.18.2" in host.check_output("nvidia-ctk --version")


def test_cdi_specification_is_written_and_labelled(host):
    spec = host.file("/etc/cdi/nvidia.yaml")
    assert spec.exists
    assert spec.mode == 0o644
    assert "llmfleet STAND-IN" in spec.content_string
    document = yaml.safe_load(spec.content_string)
    assert document["kind"] == "nvidia.com/gpu"
    assert any(device["name"] == "all" for device in document["devices"])


def test_docker_is_left_alone(host):
    # The docker role registers the runtime; this role never writes daemon.json.
    assert not host.file("/etc/docker/daemon.json").exists
