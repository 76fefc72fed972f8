"""What an operator notices on a host after the cuda role ran.

The packages are llmfleet STAND-INs (files/standins/, NOT NVIDIA's packages)
with NVIDIA's names and the version table's versions: the current-cu128
stack's Debian 12 toolkit, cuda-toolkit-12-8 at 12.8.1 (converge.yml).
"""

from __future__ import annotations

import pytest

CUDA_HOME = "/usr/local/cuda-12.8"
PACKAGES = {"cuda-toolkit-12-8": "12.8.1-1"}
PROFILE = "/etc/profile.d/cuda.sh"


@pytest.mark.parametrize(("name", "version"), PACKAGES.items())
def test_toolkit_is_installed_at_the_stack_version(host, name, version):
    package = host.package(name)
    assert package.is_installed
    assert package.version == version
    assert "llmfleet STAND-IN" in host.check_output(f"dpkg-query -W -f='${{Description}}' {name}")


@pytest.mark.parametrize("name", PACKAGES)
def test_toolkit_is_held(host, name):
    assert host.check_output(f"dpkg-query -W -f='${{Status}}' {name}").startswith("hold ")


def test_the_refused_stack_left_nothing_behind(host):
    # The first converge play ran the mission stack (CUDA 12.1.1, no Debian 12
    # packages) and the role refused it before touching the host.
    assert not host.package("cuda-toolkit-12-1").is_installed


def test_pin_file_pins_the_toolkit(host):
    pin = host.file("/etc/apt/preferences.d/llmfleet-cuda")
    assert pin.exists
    assert "Package: cuda-toolkit-12-8\n" in pin.content_string
    assert "Pin: version 12.8.1-*\n" in pin.content_string
    assert "Pin-Priority: 1001\n" in pin.content_string


def test_profile_script_sets_path_and_library_path(host):
    profile = host.file(PROFILE)
    assert profile.exists
    assert profile.mode == 0o644
    assert f'PATH="{CUDA_HOME}/bin${{PATH:+:${{PATH}}}}"' in profile.content_string
    assert f'LD_LIBRARY_PATH="{CUDA_HOME}/lib64' in profile.content_string


def test_login_shell_finds_nvcc(host):
    assert host.check_output("bash -lc 'command -v nvcc'") == f"{CUDA_HOME}/bin/nvcc"
    assert f"{CUDA_HOME}/lib64" in host.check_output("bash -lc 'echo $LD_LIBRARY_PATH'").split(":")


def test_sourcing_twice_adds_each_directory_once(host):
    path = host.check_output(f"bash -lc '. {PROFILE}; . {PROFILE}; echo $PATH'").split(":")
    assert path.count(f"{CUDA_HOME}/bin") == 1


def test_nvcc_reports_the_release_and_says_stand_in(host):
    output = host.check_output("bash -lc 'nvcc --version'")
    assert "release 12.8," in output
    assert "STAND-IN" in output
