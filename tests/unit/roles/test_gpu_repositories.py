"""The GPU roles' NVIDIA repositories and keys, as a host of each supported distribution gets them.

A site that mirrors nothing sets no repository: the nvidia_driver (with
nvidia_driver_source nvidia), cuda and nvidia_container_toolkit roles derive
NVIDIA's apt lines and signing keys from the host's distribution and
architecture. The lab replaces all three with its stand-in repository, so
only these tests see the derived values: each role's defaults, vars/main.yml
and the distribution's vars file (as its preflight loads it) are templated
by Ansible with a host's facts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

STACKS = yaml.safe_load((REPO_ROOT / "playbooks" / "vars" / "stacks.yml").read_text())["gpu_stacks"]
CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container"

HOSTS = {
    "ubuntu2204-x86_64": {"distribution": "Ubuntu", "distribution_version": "22.04",
                          "distribution_major_version": "22", "os_family": "Debian", "architecture": "x86_64"},
    "ubuntu2404-sbsa": {"distribution": "Ubuntu", "distribution_version": "24.04",
                        "distribution_major_version": "24", "os_family": "Debian", "architecture": "aarch64"},
    "debian12-x86_64": {"distribution": "Debian", "distribution_version": "12.8",
                        "distribution_major_version": "12", "os_family": "Debian", "architecture": "x86_64"},
}
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _trusted(value: Any) -> Any:
    """Strings read with yaml.safe_load marked as templates, as Ansible marks a role's files."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    return value


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def _role_vars(role: str, facts: dict[str, Any], **inventory: Any) -> dict[str, Any]:
    """What the role's tasks see after its preflight: defaults < vars/main.yml < inventory < the OS's vars file."""
    base = REPO_ROOT / "roles" / role
    candidates = [
        f"{facts['distribution']}-{facts['distribution_major_version']}.yml",
        f"{facts['distribution']}.yml",
        f"{facts['os_family']}.yml",
    ]
    os_vars = next((_load(base / "vars" / name) for name in candidates if (base / "vars" / name).is_file()), {})
    variables = _load(base / "defaults" / "main.yml") | _load(base / "vars" / "main.yml") | inventory | os_vars
    return _trusted(variables) | {
        "ansible_facts": facts,
        "gpu_stacks": STACKS,
        "gpu_stack": "current-cu128",
    }


def _value(variables: dict[str, Any], name: str) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template("{{ " + name + " }}"))


def _cuda_repo(host: str) -> tuple[str, str]:
    distro, arch = host.split("-")
    url = f"{CUDA_REPOS}/{distro}/{arch}/"
    return f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {url} /", f"{url}3bf863cc.pub"


def test_the_stack_used_here_lists_every_distribution() -> None:
    assert {host.split("-")[0] for host in HOSTS} <= set(STACKS["current-cu128"]["cuda"]["packages"])


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_cuda_defaults_to_nvidias_repository_for_the_host(host: str) -> None:
    variables = _role_vars("cuda", HOSTS[host])
    line, key = _cuda_repo(host)
    assert _value(variables, "cuda_repository") == line
    assert _value(variables, "cuda_repository_key_url") == key
    assert _value(variables, "cuda_packages") == STACKS["current-cu128"]["cuda"]["packages"][host.split("-")[0]]


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_driver_from_nvidia_shares_cudas_repository_and_key(host: str) -> None:
    variables = _role_vars("nvidia_driver", HOSTS[host], nvidia_driver_source="nvidia")
    assert (_value(variables, "nvidia_driver_repository"), _value(variables, "nvidia_driver_repository_key_url")) == (
        _cuda_repo(host)
    )


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_distributions_driver_needs_no_repository(host: str) -> None:
    variables = _role_vars("nvidia_driver", HOSTS[host], nvidia_driver_source="distro")
    assert _value(variables, "nvidia_driver_repository") == ""
    assert _value(variables, "nvidia_driver_repository_key_url") == ""


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_container_toolkit_defaults_to_nvidias_stable_repository(host: str) -> None:
    variables = _role_vars("nvidia_container_toolkit", HOSTS[host])
    arch = DEB_ARCH[HOSTS[host]["architecture"]]
    assert _value(variables, "nvidia_container_toolkit_repository") == (
        f"deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] {TOOLKIT_REPO}/stable/deb/{arch} /"
    )
    assert _value(variables, "nvidia_container_toolkit_repository_key_url") == f"{TOOLKIT_REPO}/gpgkey"


@pytest.mark.parametrize(
    ("role", "option"),
    [
        ("cuda", "cuda_repository"),
        ("nvidia_driver", "nvidia_driver_repository"),
        ("nvidia_container_toolkit", "nvidia_container_toolkit_repository"),
    ],
)
def test_a_mirror_gets_no_key_of_nvidias(role: str, option: str) -> None:
    # A site's mirror (or the lab's stand-in repository) names its own key:
    # the role must not fetch NVIDIA's for it.
    mirror = "deb [signed-by=/etc/apt/keyrings/site-mirror.asc] http://mirror.site.internal/nvidia/ /"
    variables = _role_vars(role, HOSTS["ubuntu2204-x86_64"], **{option: mirror, "nvidia_driver_source": "nvidia"})
    assert _value(variables, option) == mirror
    assert _value(variables, f"{option}_key_url") == ""
