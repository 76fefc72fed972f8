"""The nvidia_driver role refuses a driver someone else installed, and leaves DGX OS's driver alone, loudly.

tasks/driver_origin.yml runs as written, through ansible-playbook on localhost,
with a FAKE dpkg-query on PATH (answering from a table, as dpkg-query answers
glob patterns) and the .run installer's files and /etc/dgx-release pointed at
paths under tmp_path: this machine's packages and files are neither read nor
changed. Then tasks/main.yml is read as Ansible does: on DGX OS every step
after preflight is skipped.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

ROLE = REPO_ROOT / "roles" / "nvidia_driver"
ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def _fake_dpkg_query(tmp_path: Path, packages: dict[str, str]) -> Path:
    """FAKE dpkg-query --show: each pattern matched against `packages` (name -> status), rc 1 when none matches."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "packages.json").write_text(json.dumps(packages))
    query = bin_dir / "dpkg-query"
    query.write_text(f"""#!{sys.executable}
# FAKE dpkg-query for tests: the package table is {tmp_path / "packages.json"}.
import fnmatch, json, sys
args = sys.argv[1:]
# The role's --showformat, its newline written as dpkg-query's own escape.
if args[:3] != ["--show", "--showformat", r"${{Package}} ${{db:Status-Status}}\\n"]:
    print(f"FAKE dpkg-query: unexpected call {{args}}", file=sys.stderr)
    sys.exit(2)
packages = json.load(open({str(tmp_path / "packages.json")!r}))
rc = 0
for pattern in args[3:]:
    found = [name for name in packages if fnmatch.fnmatch(name, pattern)]
    if not found:
        print(f"dpkg-query: no packages found matching {{pattern}}", file=sys.stderr)
        rc = 1
    for name in found:
        print(name, packages[name])
sys.exit(rc)
""")
    query.chmod(0o755)
    return bin_dir


def _origin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packages: dict[str, str],
            files: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Runs driver_origin.yml; `files` names which of .run's files and dgx-release exist ('run', 'dgx')."""
    monkeypatch.setenv("PATH", f"{_fake_dpkg_query(tmp_path, packages)}:{os.environ['PATH']}")
    root = tmp_path / "root"
    run_files = [root / "usr/bin/nvidia-uninstall", root / "var/lib/nvidia/log"]
    dgx_release = root / "etc/dgx-release"
    if "run" in files:
        run_files[0].parent.mkdir(parents=True)
        run_files[0].write_text("#!/bin/sh\n")
    if "dgx" in files:
        dgx_release.parent.mkdir(parents=True)
        dgx_release.write_text('DGX_NAME="DGX Server"\nDGX_OTA_VERSION="6.3.1"\n')
    play = [{
        "name": "Where the driver comes from",
        "hosts": "all",
        "gather_facts": False,
        "vars_files": [str(ROLE / "vars" / "main.yml")],
        "tasks": [
            {"name": "Check the origin", "ansible.builtin.import_tasks": str(ROLE / "tasks" / "driver_origin.yml")},
            {"name": "Show the decision",
             "ansible.builtin.debug": {"msg": "vendor managed: {{ __nvidia_driver_vendor_managed }}"}},
        ],
    }]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    # Extra vars: they win over the role's vars/main.yml, which the play loads.
    paths = {"nvidia_driver_version": "535.261.03", "__nvidia_driver_dgx_release_file": str(dgx_release),
             "__nvidia_driver_run_installer_files": [str(path) for path in run_files]}
    result = run_local_playbook(tmp_path, playbook, json.dumps(paths))
    return result.returncode == 0, " ".join((result.stdout + result.stderr).split())


def test_the_patterns_match_what_ubuntu_drivers_installs() -> None:
    # Package names from Ubuntu 22.04's archive for the 535 server branch on the generic kernel.
    names = ["linux-modules-nvidia-535-server-generic-hwe-22.04", "linux-modules-nvidia-535-server-5.15.0-119-generic",
             "linux-objects-nvidia-535-server-5.15.0-119-generic", "linux-signatures-nvidia-5.15.0-119-generic"]
    patterns = ROLE_VARS["__nvidia_driver_precompiled_patterns"]
    assert [name for name in names if not any(fnmatch.fnmatch(name, p) for p in patterns)] == []
    assert not any(fnmatch.fnmatch("nvidia-dkms-535", p) for p in patterns)


def test_a_host_with_only_the_roles_packages_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passed, output = _origin(tmp_path, monkeypatch, {"nvidia-dkms-535": "installed"})
    assert passed, output[-3000:]
    assert "vendor managed: False" in output
    assert "WARNING" not in output


def test_ubuntus_precompiled_modules_are_refused_naming_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packages = {
        "linux-modules-nvidia-535-server-5.15.0-119-generic": "installed",
        "linux-signatures-nvidia-5.15.0-119-generic": "installed",
        # Removed before, its configuration kept: not a driver any more, not named.
        "linux-modules-nvidia-535-server-5.15.0-118-generic": "config-files",
        "nvidia-dkms-535": "installed",
    }
    passed, output = _origin(tmp_path, monkeypatch, packages)
    assert not passed
    assert ("runs Ubuntu's precompiled NVIDIA modules (linux-modules-nvidia-535-server-5.15.0-119-generic, "
            "linux-signatures-nvidia-5.15.0-119-generic)") in output
    assert ("apt-get purge linux-modules-nvidia-535-server-5.15.0-119-generic "
            "linux-signatures-nvidia-5.15.0-119-generic") in output
    assert "5.15.0-118" not in output
    assert "do not run ubuntu-drivers on this host again" in output


def test_the_run_installer_is_still_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passed, output = _origin(tmp_path, monkeypatch, {}, files=("run",))
    assert not passed
    assert "has a driver installed by NVIDIA's .run installer" in output
    assert "nvidia-uninstall --silent" in output


def test_dgx_os_is_left_alone_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passed, output = _origin(tmp_path, monkeypatch, {"nvidia-driver-535-server": "installed"}, files=("dgx",))
    assert passed, output[-3000:]
    assert "vendor managed: True" in output
    assert "WARNING: localhost runs DGX OS" in output
    assert "nvidia_driver_version (535.261.03) is not applied" in output


def test_on_dgx_os_every_step_after_preflight_is_skipped() -> None:
    steps = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    assert steps[0]["ansible.builtin.import_tasks"] == "preflight.yml"
    assert "when" not in steps[0]
    assert [step["ansible.builtin.import_tasks"] for step in steps[1:]] == ["install.yml", "configure.yml",
                                                                            "verify.yml"]
    assert {step["when"] for step in steps[1:]} == {"not __nvidia_driver_vendor_managed | bool"}
