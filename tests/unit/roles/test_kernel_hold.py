"""nvidia_driver_kernel_updates: hold (the default) holds the installed kernel metapackages of the running flavour.

With the kernel and headers metapackages held, no upgrade brings a kernel
ABI whose DKMS module was never built. The Molecule scenario runs in a
container, which has no kernel packages, so it tests `blacklist` only; here
the two tasks of tasks/configure.yml that make the hold run as written,
through ansible-playbook on localhost, with the host's facts given and a
FAKE dpkg-query and dpkg on PATH. The fakes answer from a table and record
what they were asked: this machine's packages are neither read nor changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "nvidia_driver"
CONFIGURE = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
TASKS = ["configure | Read which kernel metapackages are installed", "configure | Hold the kernel with the driver"]

DEBIAN_12 = {
    "distribution": "Debian",
    "distribution_version": "12.8",
    "distribution_major_version": "12",
    "os_family": "Debian",
    "kernel": "6.1.0-26-amd64",
}
UBUNTU_2204 = {
    "distribution": "Ubuntu",
    "distribution_version": "22.04",
    "distribution_major_version": "22",
    "os_family": "Debian",
    "kernel": "5.15.0-119-generic",
}
UBUNTU_2204_HWE = {**UBUNTU_2204, "kernel": "6.8.0-45-generic"}
UBUNTU_2404 = {
    "distribution": "Ubuntu",
    "distribution_version": "24.04",
    "distribution_major_version": "24",
    "os_family": "Debian",
    "kernel": "6.8.0-45-generic",
}


def _fake_dpkg(tmp_path: Path, states: dict[str, str]) -> Path:
    """FAKE dpkg-query and dpkg: package states from `states`; queries and new selections logged under tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "status").write_text("".join(f"{name} {state}\n" for name, state in states.items()))
    query = bin_dir / "dpkg-query"
    # The role's --showformat, which the fake emulates; any other call is an error.
    query.write_text(f"""#!/bin/sh
# FAKE dpkg-query for tests.
if [ "$1" != --show ] || [ "$2" != --showformat ] || [ "$3" != '${{Package}} ${{db:Status-Status}}\\n' ]; then
  echo "FAKE dpkg-query: unexpected call: $*" >&2; exit 2
fi
shift 3
echo "$*" >> {tmp_path}/queried
rc=0
for name in "$@"; do
  state=$(awk -v name="$name" '$1 == name {{print $2}}' {tmp_path}/status)
  if [ -n "$state" ]; then echo "$name $state"; else echo "dpkg-query: no packages found matching $name" >&2; rc=1; fi
done
exit $rc
""")
    dpkg = bin_dir / "dpkg"
    dpkg.write_text(f"""#!/bin/sh
# FAKE dpkg for tests: what ansible.builtin.dpkg_selections calls.
case "$1" in
  --get-selections) awk -v name="$2" '$1 == name {{print $1 "\\tinstall"}}' {tmp_path}/status ;;
  --set-selections) cat >> {tmp_path}/selections ;;
  *) echo "FAKE dpkg: unexpected call: $*" >&2; exit 2 ;;
esac
""")
    for tool in (query, dpkg):
        tool.chmod(0o755)
    return bin_dir


def _configure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, facts: dict[str, Any], states: dict[str, str], mode: str = "hold"
) -> tuple[list[str], list[str]]:
    """Run the hold's tasks for a host with `facts`; the names dpkg-query was asked about, and those held."""
    monkeypatch.setenv("PATH", f"{_fake_dpkg(tmp_path, states)}:{os.environ['PATH']}")
    tasks = [task for task in CONFIGURE if task["name"] in TASKS]
    assert [task["name"] for task in tasks] == TASKS, "configure.yml no longer has the hold's tasks: update this test"
    play = [
        {
            "name": "Kernel hold",
            "hosts": "all",
            "gather_facts": False,
            # As preflight loads them: vars/main.yml, then the distribution's file.
            "vars_files": [str(ROLE / "vars" / "main.yml"), str(ROLE / "vars" / f"{facts['distribution']}.yml")],
            "vars": {"nvidia_driver_kernel_updates": mode},
            "tasks": tasks,
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, playbook, json.dumps({"ansible_facts": facts}))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    queried = (tmp_path / "queried").read_text().split() if (tmp_path / "queried").exists() else []
    selections = (tmp_path / "selections").read_text().splitlines() if (tmp_path / "selections").exists() else []
    held = [line.split()[0] for line in selections if line.split()[1:] == ["hold"]]
    assert len(held) == len(selections), f"selections other than hold: {selections}"
    return queried, held


@pytest.mark.parametrize(
    ("facts", "image", "headers"),
    [
        (DEBIAN_12, "linux-image-amd64", "linux-headers-amd64"),
        (UBUNTU_2204, "linux-image-generic", "linux-headers-generic"),
        # A hardware-enablement kernel (not 22.04's 5.15) follows the HWE metapackages.
        (UBUNTU_2204_HWE, "linux-image-generic-hwe-22.04", "linux-headers-generic-hwe-22.04"),
        (UBUNTU_2404, "linux-image-generic", "linux-headers-generic"),
    ],
    ids=["debian12", "ubuntu2204", "ubuntu2204-hwe", "ubuntu2404"],
)
def test_hold_holds_the_running_flavours_kernel_and_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, facts: dict[str, Any], image: str, headers: str
) -> None:
    states = {image: "installed", headers: "installed", "linux-image-6.1.0-26-amd64": "installed"}
    queried, held = _configure(tmp_path, monkeypatch, facts, states)
    assert queried == [image, headers]
    # The metapackages only: the running kernel's own package keeps its security fixes.
    assert sorted(held) == sorted([image, headers])


def test_hold_leaves_metapackages_that_are_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Headers removed but not purged (config-files): holding them would bring nothing back.
    states = {"linux-image-amd64": "installed", "linux-headers-amd64": "config-files"}
    _, held = _configure(tmp_path, monkeypatch, DEBIAN_12, states)
    assert held == ["linux-image-amd64"]


def test_hold_on_a_host_without_kernel_packages_holds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A container: dpkg-query knows neither package and exits 1, which is not a failure.
    queried, held = _configure(tmp_path, monkeypatch, DEBIAN_12, {})
    assert queried == ["linux-image-amd64", "linux-headers-amd64"]
    assert held == []


@pytest.mark.parametrize("mode", ["blacklist", "none"])
def test_the_other_modes_hold_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    states = {"linux-image-amd64": "installed", "linux-headers-amd64": "installed"}
    queried, held = _configure(tmp_path, monkeypatch, DEBIAN_12, states, mode=mode)
    assert (queried, held) == ([], [])


def test_hold_is_the_default() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["nvidia_driver_kernel_updates"] == "hold"
