"""The docker role pins the engine per supported release, each pin a build of that release.

The role's preflight loads vars/<Distribution>-<major>.yml with first_found
and takes docker_packages from it. Molecule proves the Debian 12 file only
(its container is Debian 12); these tests hold every supported release to a
file of its own whose versions carry that release's build suffix, so a pin
copied from another distribution (Debian's +deb12 builds on Ubuntu, the case
issue 16 found) fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

ROLE = REPO_ROOT / "roles" / "docker"
SUPPORTED: dict[str, list[str]] = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__docker_supported_os"]
RELEASES = [(name, version) for name, versions in SUPPORTED.items() for version in versions]
# How each distribution's archive marks its builds of a release.
BUILD_SUFFIX = {"Debian": r"deb{major}", "Ubuntu": r"ubuntu"}
ENGINE = {"docker.io", "containerd", "runc"}


def _pins(name: str, version: str) -> tuple[Path, list[dict[str, Any]]]:
    path = ROLE / "vars" / f"{name}-{version.split('.')[0]}.yml"
    assert path.is_file(), f"{name} {version} is supported but has no pin file {path.relative_to(REPO_ROOT)}"
    return path, yaml.safe_load(path.read_text())["__docker_packages"]


def test_releases_are_found() -> None:
    assert ("Ubuntu", "22.04") in RELEASES and ("Debian", "12") in RELEASES, RELEASES


@pytest.mark.parametrize(("name", "version"), RELEASES, ids=[f"{name}-{version}" for name, version in RELEASES])
def test_each_release_pins_the_engine_with_its_own_builds(name: str, version: str) -> None:
    path, pins = _pins(name, version)
    assert {pin["name"] for pin in pins} == ENGINE, path
    suffix = BUILD_SUFFIX[name].format(major=version.split(".")[0])
    for pin in pins:
        assert isinstance(pin["version"], str) and suffix in pin["version"], (
            f"{path.relative_to(REPO_ROOT)}: {pin['name']} {pin['version']!r} is not a {name} {version} build "
            f"(no {suffix!r} in it)"
        )


def test_the_default_packages_are_the_release_pins() -> None:
    defaults = (ROLE / "defaults" / "main.yml").read_text()
    assert 'docker_packages: "{{ __docker_packages | default([]) }}"' in defaults


def test_the_preflight_loads_the_release_file_by_first_found() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    loads = [task for task in tasks if "ansible.builtin.include_vars" in task]
    files = [name for task in loads for name in task.get("vars", {}).get("__docker_release_vars", {}).get("files", [])]
    assert "{{ ansible_facts['distribution'] }}-{{ ansible_facts['distribution_major_version'] }}.yml" in files
