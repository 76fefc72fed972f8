"""The roles' checks of what the apt sources offer, run as written against a FAKE apt-cache madison.

cuda, nvidia_container_toolkit, docker and nvidia_driver (the driver, its whole set and Fabric Manager)
each ask `apt-cache madison` which versions are offered and refuse a pin the sources lack, naming what
they offer. Molecule runs them against the stand-in repositories, where every pin is offered; here the
tasks run through ansible-playbook on localhost with a FAKE apt-cache (and dpkg-query, for the driver's
set) on PATH that answers from a table, so a missing pin and the message it gets are checked too.
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

ROLES = REPO_ROOT / "roles"
NVIDIA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages"
DEBIAN = "http://deb.debian.org/debian bookworm/main amd64 Packages"
CUDA_REPOSITORY = f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {NVIDIA_REPO.split()[0]}/ /"


def _fakes(tmp_path: Path, offered: list[tuple[str, str, str]], installed: dict[str, str]) -> Path:
    """FAKE apt-cache (madison only) and dpkg-query (the driver set's query only) on a PATH dir."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "offered").write_text("".join(f"{name}|{version}|{source}\n" for name, version, source in offered))
    (tmp_path / "installed").write_text("".join(f"installed {name} {version}\n" for name, version in installed.items()))
    apt_cache = bin_dir / "apt-cache"
    # madison's layout: per name asked, its lines in the table's order, the first two fields right-aligned.
    apt_cache.write_text(f"""#!/bin/sh
# FAKE apt-cache for tests.
[ "$1" = madison ] || {{ echo "FAKE apt-cache: unexpected call: $*" >&2; exit 2; }}
shift
for name in "$@"; do
  awk -F'|' -v name="$name" '$1 == name {{printf "%10s | %10s | %s\\n", $1, $2, $3}}' {tmp_path}/offered
done
""")
    dpkg_query = bin_dir / "dpkg-query"
    dpkg_query.write_text(f"""#!/bin/sh
# FAKE dpkg-query for tests.
[ "$1 $2 $3" = '--show --showformat ${{db:Status-Status}} ${{Package}} ${{Version}}\\n' ] || {{
  echo "FAKE dpkg-query: unexpected call: $*" >&2; exit 2; }}
cat {tmp_path}/installed
""")
    for tool in (apt_cache, dpkg_query):
        tool.chmod(0o755)
    return bin_dir


def _run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tasks_file: str,
    names: list[str],
    variables: dict[str, Any],
    offered: list[tuple[str, str, str]],
    installed: dict[str, str] | None = None,
    report: list[str] | None = None,
) -> dict[str, Any]:
    """Run the named tasks of roles/<tasks_file> (the assert's result kept, not fatal): the result and `report`."""
    monkeypatch.setenv("PATH", f"{_fakes(tmp_path, offered, installed or {})}:{os.environ['PATH']}")
    role, _, name = tasks_file.partition("/")
    by_name = {task["name"]: task for task in yaml.safe_load((ROLES / role / "tasks" / name).read_text())}
    tasks = [dict(by_name[task_name]) for task_name in names]
    check = next(task for task in tasks if "ansible.builtin.assert" in task)
    check.update({"register": "__test_check", "ignore_errors": True})
    written = ", ".join(f"{key!r}: {key}" for key in ["__test_check", *(report or [])])
    tasks.append(
        {
            "name": "Write down what the check said",
            "ansible.builtin.copy": {"content": "{{ {" + written + "} | to_json }}", "dest": f"{tmp_path}/out.json"},
        }
    )
    play = [
        {
            "name": "What the apt sources offer",
            "hosts": "all",
            "gather_facts": False,
            "vars_files": [str(ROLES / role / "vars" / "main.yml")],
            "vars": variables,
            "tasks": tasks,
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    result = run_local_playbook(tmp_path, playbook, json.dumps({"ansible_facts": {"packages": {}}}))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    out: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    return out


CUDA = {
    "cuda_packages": ["cuda-toolkit-12-4", "cuda-libraries-12-4"],
    "cuda_package_version": "12.4.1-*",
    "cuda_repository": CUDA_REPOSITORY,
    "__cuda_repository_distro": "debian12",
    "__cuda_repository_added": {"changed": False},
}
CUDA_TASKS = [
    "install | List the toolkit versions the repositories offer",
    "install | Check that the repositories offer the pinned version",
]


def test_cuda_refuses_a_version_the_sources_lack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offered = [
        ("cuda-toolkit-12-4", "12.4.1-1", NVIDIA_REPO),
        ("cuda-toolkit-12-4", "12.4.0-1", NVIDIA_REPO),
        ("cuda-libraries-12-4", "12.4.0-1", NVIDIA_REPO),
    ]
    check = _run(tmp_path, monkeypatch, "cuda/install.yml", CUDA_TASKS, CUDA, offered)["__test_check"]
    assert check["failed"] is True
    assert check["msg"] == (
        f"No cuda-libraries-12-4 at version 12.4.1-* in the host's apt sources ({CUDA_REPOSITORY}). Versions offered: "
        '{"cuda-toolkit-12-4": ["12.4.1-1", "12.4.0-1"], "cuda-libraries-12-4": ["12.4.0-1"]}. Point cuda_repository'
        " at NVIDIA's CUDA repository for debian12, or choose a stack whose CUDA it offers."
    )


def test_cuda_passes_when_every_package_is_offered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offered = [
        ("cuda-toolkit-12-4", "12.4.1-1", NVIDIA_REPO),
        ("cuda-libraries-12-4", "12.4.1-1", NVIDIA_REPO),
        ("cuda-libraries-12-4", "12.4.0-1", NVIDIA_REPO),
    ]
    check = _run(tmp_path, monkeypatch, "cuda/install.yml", CUDA_TASKS, CUDA, offered)["__test_check"]
    assert check["failed"] is False, check


def test_the_container_toolkit_refuses_a_release_the_sources_lack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variables = {
        "nvidia_container_toolkit_packages": ["nvidia-container-toolkit", "nvidia-container-toolkit-base"],
        "nvidia_container_toolkit_package_version": "1.17.8-*",
        "nvidia_container_toolkit_repository": "",
        "__nvidia_container_toolkit_repository_added": {"changed": False},
    }
    tasks = [
        "install | List the toolkit versions the repositories offer",
        "install | Check that the repositories offer the pinned release",
    ]
    offered = [
        ("nvidia-container-toolkit", "1.17.8-1", NVIDIA_REPO),
        ("nvidia-container-toolkit-base", "1.17.7-1", NVIDIA_REPO),
    ]
    check = _run(tmp_path, monkeypatch, "nvidia_container_toolkit/install.yml", tasks, variables, offered)[
        "__test_check"
    ]
    assert check["msg"] == (
        "No nvidia-container-toolkit-base at version 1.17.8-* in the host's apt sources"
        " (nvidia_container_toolkit_repository is empty). Versions offered: "
        '{"nvidia-container-toolkit": ["1.17.8-1"], "nvidia-container-toolkit-base": ["1.17.7-1"]}.'
        " Set nvidia_container_toolkit_version to one of them, or point nvidia_container_toolkit_repository at"
        " NVIDIA's container toolkit repository."
    )


def test_docker_refuses_a_pin_the_sources_lack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    variables = {
        "docker_packages": [
            {"name": "docker.io", "version": "20.10.24+dfsg1-1+deb12u1+b6"},
            {"name": "runc", "version": "1.1.5+ds1-1+deb12u1"},
        ]
    }
    tasks = [
        "install | Find the versions the apt sources offer",
        "install | Check that each pinned version is installed or offered",
    ]
    offered = [
        ("docker.io", "20.10.24+dfsg1-1+deb12u1+b6", DEBIAN),
        ("docker.io", "20.10.24+dfsg1-1+b3", DEBIAN),
        ("runc", "1.1.5+ds1-1+deb12u2", DEBIAN),
    ]
    results = _run(tmp_path, monkeypatch, "docker/install.yml", tasks, variables, offered)["__test_check"]["results"]
    assert [result["failed"] for result in results] == [False, True]
    assert results[1]["msg"] == (
        "runc is pinned to 1.1.5+ds1-1+deb12u1, which the host's apt sources do not offer (they offer:"
        " 1.1.5+ds1-1+deb12u2). Pick one of those in docker_packages (and check it with the engine's other"
        " packages), or fix the apt sources."
    )


DRIVER = {
    "nvidia_driver_version": "535.261.03",
    "nvidia_driver_package_version": "535.261.03-*",
    "nvidia_driver_packages": ["nvidia-driver", "nvidia-kernel-dkms"],
    "nvidia_driver_companion_packages": ["nvidia-persistenced"],
    "nvidia_driver_repository": "",
    "nvidia_driver_source": "distro",
    "nvidia_driver_fabric_manager_packages": ["nvidia-fabricmanager-535", "libnvidia-nscq-535"],
    "nvidia_driver_fabric_manager_package_version": "535.261.03-*",
    "__nvidia_driver_repository_added": {"changed": False},
}


def test_the_driver_refuses_a_version_the_sources_lack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [
        "install | List the driver versions the repositories offer",
        "install | Check that the repositories offer the pinned version",
    ]
    offered = [
        ("nvidia-driver", "535.261.03-1", DEBIAN),
        ("nvidia-driver", "535.216.01-1~deb12u1", DEBIAN),
        ("nvidia-kernel-dkms", "535.216.01-1~deb12u1", DEBIAN),
    ]
    check = _run(tmp_path, monkeypatch, "nvidia_driver/install.yml", tasks, DRIVER, offered)["__test_check"]
    assert check["msg"] == (
        "No nvidia-kernel-dkms at version 535.261.03-* in the host's apt sources. Versions offered: "
        '{"nvidia-driver": ["535.261.03-1", "535.216.01-1~deb12u1"], "nvidia-kernel-dkms": ["535.216.01-1~deb12u1"]}.'
        " Set nvidia_driver_version (and nvidia_driver_package_version) to one of them, or point"
        " nvidia_driver_repository at a repository that has it (Debian: enable non-free and contrib)."
    )


def test_fabric_manager_refuses_a_transitional_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [
        "fabric_manager | List the Fabric Manager versions the repositories offer",
        "fabric_manager | Check that the repositories offer Fabric Manager at the driver's version",
    ]
    # Ubuntu's archive: nvidia-fabricmanager-535 at 535.261.03-1 too, NSCQ only as another branch's version.
    offered = [
        ("nvidia-fabricmanager-535", "535.261.03-0ubuntu1", DEBIAN),
        ("libnvidia-nscq-535", "550.163.01-0ubuntu1", DEBIAN),
    ]
    check = _run(tmp_path, monkeypatch, "nvidia_driver/fabric_manager.yml", tasks, DRIVER, offered)["__test_check"]
    assert check["msg"].startswith(
        "localhost has NVSwitches (or nvidia_driver_fabric_manager is true), and NVIDIA Fabric Manager starts only"
        " with a driver of exactly its own version, but the host's apt sources offer no libnvidia-nscq-535 at"
        " 535.261.03-*, the version of driver 535.261.03. Versions offered: "
        '{"nvidia-fabricmanager-535": ["535.261.03-0ubuntu1"], "libnvidia-nscq-535": ["550.163.01-0ubuntu1"]}.'
        " No package was installed or changed."
    ), check["msg"]


DRIVER_SET_TASKS = [
    "driver_set | List the installed packages and their versions",
    "driver_set | Note the installed NVIDIA packages",
    "driver_set | List the versions the repositories offer of them",
    "driver_set | Note the driver's set and its packages at another version",
    "driver_set | Check that the driver's set is one release",
]


def test_the_driver_set_names_a_library_of_another_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = {
        "nvidia-driver": "535.261.03-1",
        "nvidia-kernel-dkms": "535.261.03-1",
        "libnvidia-ml1": "535.216.01-1~deb12u1",
        "libcuda1": "535.261.03-1",
        # Versions of its own: never offered at the driver's, so not in the set.
        "nvidia-persistenced": "535.171.04-1",
        "bash": "5.2.15-2+b7",
    }
    offered = [
        ("nvidia-driver", "535.261.03-1", NVIDIA_REPO),
        ("nvidia-driver", "535.216.01-1~deb12u1", DEBIAN),
        ("nvidia-kernel-dkms", "535.261.03-1", NVIDIA_REPO),
        ("libnvidia-ml1", "535.261.03-2", NVIDIA_REPO),
        ("libnvidia-ml1", "535.261.03-1", NVIDIA_REPO),
        ("libnvidia-ml1", "535.216.01-1~deb12u1", DEBIAN),
        ("libcuda1", "535.261.03-1", NVIDIA_REPO),
        ("nvidia-persistenced", "535.171.04-1", DEBIAN),
    ]
    report = ["__nvidia_driver_set", "__nvidia_driver_set_mixed"]
    out = _run(
        tmp_path, monkeypatch, "nvidia_driver/driver_set.yml", DRIVER_SET_TASKS, DRIVER, offered, installed, report
    )
    assert out["__nvidia_driver_set"] == {
        "nvidia-driver": "535.261.03-1",
        "nvidia-kernel-dkms": "535.261.03-1",
        "libnvidia-ml1": "535.216.01-1~deb12u1",
        "libcuda1": "535.261.03-1",
    }
    # The newest at the driver's version, which madison lists first.
    assert out["__nvidia_driver_set_mixed"] == {"libnvidia-ml1": "535.261.03-2"}
    assert out["__test_check"]["msg"] == (
        "NVIDIA driver 535.261.03 (535.261.03-*) is installed beside libnvidia-ml1 535.216.01-1~deb12u1: packages of"
        " its set at another version, which the repositories also offer at the driver's. The driver's libraries must"
        " all be its own release. Put them back with `apt-get install --allow-downgrades --allow-change-held-packages"
        " libnvidia-ml1=535.261.03-2`, or purge the ones nothing needs; to move the whole driver, change"
        " nvidia_driver_version instead."
    )


def test_the_driver_set_of_a_host_without_nvidia_packages_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No NVIDIA package installed: madison is not asked (its task skipped) and the set is empty.
    report = ["__nvidia_driver_set", "__nvidia_driver_set_mixed"]
    out = _run(
        tmp_path, monkeypatch, "nvidia_driver/driver_set.yml", DRIVER_SET_TASKS, DRIVER, [], {"bash": "5.2"}, report
    )
    assert (out["__nvidia_driver_set"], out["__nvidia_driver_set_mixed"]) == ({}, {})
    assert out["__test_check"]["failed"] is False
    assert out["__test_check"]["msg"] == "The driver's set, 0 package(s), is at 535.261.03-*."
