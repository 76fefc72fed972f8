"""The docker role pins the engine per supported release, each pin a build of that release.

The role's preflight loads vars/<Distribution>-<major>.yml with first_found
and takes docker_packages from it. Molecule proves the Debian 12 file only
(its container is Debian 12); these tests hold every supported release to a
file of its own whose versions carry that release's build suffix, so a pin
copied from another distribution (Debian's +deb12 builds on Ubuntu, the case
issue 16 found) fails here.

Every pinned runc must also carry the fix of CVE-2024-21626 (runc before 1.1.12,
a container escape), as the role's preflight judges it: upstream 1.1.12 or
later, or a distribution build the role knows has the fix backported. The
comparison is dpkg's, checked here against `dpkg --compare-versions`.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
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

_SPEC = importlib.util.spec_from_file_location(
    "llmfleet_filter_packages", REPO_ROOT / "plugins" / "filter" / "packages.py"
)
assert _SPEC and _SPEC.loader
packages = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(packages)

DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
BACKPORTS: dict[str, dict[str, str]] = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())[
    "__docker_runc_backports"
]
RUNC_MIN = DEFAULTS["docker_runc_min_version"]


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


def test_the_threshold_is_the_cve_2024_21626_fix() -> None:
    # runc 1.1.12 fixed CVE-2024-21626; the backports table is for that release.
    assert RUNC_MIN == "1.1.12"
    assert set(BACKPORTS) == {"1.1.12"}


@pytest.mark.parametrize(("name", "version"), RELEASES, ids=[f"{name}-{version}" for name, version in RELEASES])
def test_each_release_pins_a_runc_without_cve_2024_21626(name: str, version: str) -> None:
    path, pins = _pins(name, version)
    release = f"{name}-{version.split('.')[0]}"
    problem = packages.docker_runc_problem(pins, release, RUNC_MIN, BACKPORTS)
    assert problem == "", f"{path.relative_to(REPO_ROOT)}: {problem}"


@pytest.mark.parametrize(
    ("release", "runc", "fixed"),
    [
        # Ubuntu 22.04: the release pocket's build, the last one before USN-6619-1, its fix, jammy-updates today.
        ("Ubuntu-22", "1.1.0-0ubuntu1", False),
        ("Ubuntu-22", "1.1.7-0ubuntu1~22.04.1", False),
        ("Ubuntu-22", "1.1.7-0ubuntu1~22.04.2", True),
        ("Ubuntu-22", "1.1.12-0ubuntu2~22.04.1", True),
        ("Ubuntu-22", "1.3.4-0ubuntu1~22.04.1", True),
        # Debian 12: bookworm's first build, and DSA-5615-1's, which backports the fix into 1.1.5.
        ("Debian-12", "1.1.5+ds1-1", False),
        ("Debian-12", "1.1.5+ds1-1+b1", False),
        ("Debian-12", "1.1.5+ds1-1+deb12u1", True),
        # A backport of one release is not one of another.
        ("Ubuntu-24", "1.1.5+ds1-1+deb12u1", False),
        ("Ubuntu-24", "1.1.12-0ubuntu3", True),
        ("Ubuntu-24", "1.1.12~rc1-0ubuntu1", False),
        ("Ubuntu-24", "1.1.11-0ubuntu1", False),
        # An epoch orders packages; it does not make upstream 1.0.0 carry a 1.1.12 fix.
        ("Ubuntu-24", "1:1.0.0-1", False),
    ],
)
def test_the_runc_check_knows_backported_fixes(release: str, runc: str, fixed: bool) -> None:
    problem = packages.docker_runc_problem([{"name": "runc", "version": runc}], release, RUNC_MIN, BACKPORTS)
    assert (problem == "") is fixed, problem
    if not fixed:
        assert "CVE-2024-21626" in problem and runc in problem and "1.1.12" in problem, problem


def test_a_raised_threshold_ignores_older_backports() -> None:
    pins = [{"name": "runc", "version": "1.1.5+ds1-1+deb12u1"}]
    assert packages.docker_runc_problem(pins, "Debian-12", "1.2.8", BACKPORTS) != ""


def test_no_runc_pin_is_not_judged() -> None:
    # Docker CE: containerd.io bundles its own runc.
    pins = [
        {"name": "docker-ce", "version": "5:27.5.1-1~debian.12~bookworm"},
        {"name": "containerd.io", "version": "1.7.25-1"},
    ]
    assert packages.docker_runc_problem(pins, "Debian-12", RUNC_MIN, BACKPORTS) == ""


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("1.1.5+ds1-1+deb12u1", "1.1.5+ds1-1"),
        ("1.1.7-0ubuntu1~22.04.2", "1.1.7-0ubuntu1~22.04.1"),
        ("1.1.12~rc1", "1.1.12"),
        ("1.1.5+ds1", "1.1.12"),
        ("1.3.4-0ubuntu1~22.04.1", "1.1.12"),
        ("1:1.0-1", "2.0-1"),
        ("1.0", "1.0-0"),
        ("1.0a", "1.0+"),
        ("2.2.1-0ubuntu1~22.04.2", "2.2.1-0ubuntu1"),
    ],
)
def test_versions_compare_as_dpkg_compares_them(left: str, right: str) -> None:
    ours = packages.deb_version_compare(left, right)
    assert packages.deb_version_compare(right, left) == -ours
    if shutil.which("dpkg") is None:
        pytest.skip("no dpkg here to compare with")
    for relation, expected in (("lt", ours < 0), ("eq", ours == 0), ("gt", ours > 0)):
        result = subprocess.run(["dpkg", "--compare-versions", left, relation, right], check=False)
        assert (result.returncode == 0) is expected, (left, relation, right)


@pytest.mark.parametrize("bad", ["", "not a version", "-1", None])
def test_a_malformed_version_is_refused(bad: object) -> None:
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError):
        packages.deb_version_compare(bad, "1.0")  # type: ignore[arg-type]


def test_the_preflight_refuses_a_vulnerable_runc_before_installing() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    names = [task["name"] for task in tasks]
    refusal = names.index("preflight | Refuse a runc open to CVE-2024-21626")
    assert refusal > names.index("preflight | Load the release's engine pins")
    assert "docker_runc_problem" in str(tasks[refusal]["vars"]) and "docker_runc_min_version" in str(tasks[refusal])


# What `runc --version` prints: containerd.io's build (upstream numbers) and Debian's.
CE_RUNC_1_1_12 = "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e94\nspec: 1.0.2-dev\ngo: go1.20.13\nlibseccomp: 2.5.4\n"
CE_RUNC_1_1_9 = "runc version 1.1.9\ncommit: v1.1.9-0-gccaecfc\nspec: 1.0.2-dev\n"
DEBIAN_RUNC = "runc version 1.1.5+ds1\nspec: 1.0.2-dev\ngo: go1.19.8\nlibseccomp: 2.5.4\n"


@pytest.mark.parametrize(
    ("output", "package", "fixed"),
    [
        # Docker CE: no runc package, judged by the binary's upstream version.
        (CE_RUNC_1_1_12, "", True),
        (CE_RUNC_1_1_9, "", False),
        # A distribution's runc: judged by its package version, which names the backport.
        (DEBIAN_RUNC, "1.1.5+ds1-1+deb12u1", True),
        (DEBIAN_RUNC, "1.1.5+ds1-1", False),
    ],
)
def test_the_installed_runc_is_judged_whichever_package_brought_it(output: str, package: str, fixed: bool) -> None:
    problem = packages.installed_runc_problem(output, package, "Debian-12", RUNC_MIN, BACKPORTS)
    assert (problem == "") is fixed, problem
    if not fixed:
        assert "CVE-2024-21626" in problem and "the host runs runc" in problem, problem
        assert ("containerd.io" in problem) is (package == ""), problem


def test_a_runc_that_prints_no_version_is_an_error() -> None:
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="no 'runc version' line"):
        packages.installed_runc_problem("runc: command not found", "", "Debian-12", RUNC_MIN, BACKPORTS)


def test_the_verify_checks_the_runc_the_engine_runs() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "verify.yml").read_text())
    check = next(task for task in tasks if "CVE-2024-21626" in task["name"])
    assert "installed_runc_problem" in str(check["vars"]) and "docker_runc_min_version" in str(check["vars"])


def test_the_highest_version_is_dpkg_s() -> None:
    kernels = ["6.1.0-26-amd64", "6.1.0-101-amd64", "6.1.0-9-amd64"]
    assert packages.deb_version_max(kernels) == "6.1.0-101-amd64"
    assert packages.deb_version_max([]) == ""
