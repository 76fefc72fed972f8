"""image_delivery refuses a load the host has no disk for, before copying gigabytes.

The role's own tasks (tasks/main.yml) run as written through ansible-playbook on
localhost: the archive's stat, the check that it exists, the real `df`, and the
room check. The archive is a sparse file of the size under test, so no disk is
used. One stand-in: the engine's answer (docker_host_info) is given as a fact
naming a directory under tmp_path as its image store, so no Docker is needed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from llmfleet.paths import REPO_ROOT
from tests.tools import run_local_playbook

MAIN = yaml.safe_load((REPO_ROOT / "roles" / "image_delivery" / "tasks" / "main.yml").read_text())
LOAD_BLOCK = next(task for task in MAIN if "block" in task)["block"]
TASKS = [
    "Read the archive's size on the controller",
    "Check the archive exists on the controller",
    "Read the free space where the archive is copied and loaded",
    "Check the host has room for the archive and the loaded image",
]
RESERVE_MIB = 1024


def _run(tmp_path: Path, archive: Path, tmp_dir: Path, docker_root: Path) -> tuple[int, str]:
    tasks: list[dict[str, Any]] = [task for task in LOAD_BLOCK if task["name"] in TASKS]
    assert [task["name"] for task in tasks] == TASKS
    engine = {"host_info": {"DockerRootDir": str(docker_root)}}
    given_engine = {"ansible.builtin.set_fact": {"__image_delivery_host": engine}}
    play = {"hosts": "localhost", "gather_facts": False, "tasks": [given_engine, *tasks]}
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(yaml.safe_dump([play]))
    variables = {
        "image_delivery_image": "llmfleet/vllm-cpu:test",
        "image_delivery_archive": str(archive),
        "image_delivery_tmp_dir": str(tmp_dir),
        "image_delivery_disk_reserve_mib": RESERVE_MIB,
    }
    result = run_local_playbook(tmp_path, playbook, json.dumps(variables))
    return result.returncode, result.stdout + result.stderr


def _free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def _sparse_archive(tmp_path: Path, size: int) -> Path:
    archive = tmp_path / "image.tar"
    with archive.open("wb") as out:
        out.truncate(size)
    return archive


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    copies, images = tmp_path / "copies", tmp_path / "images"
    copies.mkdir()
    images.mkdir()
    return copies, images


def test_an_archive_that_fits_passes(tmp_path: Path) -> None:
    copies, images = _dirs(tmp_path)
    code, output = _run(tmp_path, _sparse_archive(tmp_path, 10 * 1024 * 1024), copies, images)
    assert code == 0, output
    assert "ok=5" in output and "failed=0" in output


def test_an_archive_larger_than_the_free_disk_is_refused_with_the_figures(tmp_path: Path) -> None:
    copies, images = _dirs(tmp_path)
    size = _free_bytes(tmp_path) + 10 * 1024**3
    code, output = _run(tmp_path, _sparse_archive(tmp_path, size), copies, images)
    assert code != 0
    assert "Not enough disk for llmfleet/vllm-cpu:test" in output
    assert f"its archive is {size / 1024**3:.1f} GiB" in output
    assert f"with the {RESERVE_MIB} MiB reserve" in output


def test_one_filesystem_must_hold_the_copy_and_the_layers_at_once(tmp_path: Path) -> None:
    # Half the free space would fit once, but the copy and the loaded layers share this filesystem.
    copies, images = _dirs(tmp_path)
    size = (_free_bytes(tmp_path) - RESERVE_MIB * 1024 * 1024) * 3 // 4
    code, output = _run(tmp_path, _sparse_archive(tmp_path, size), copies, images)
    assert code != 0
    assert f"{(2 * size + RESERVE_MIB * 1024 * 1024) / 1024**3:.1f} GiB needed" in output


def test_a_missing_archive_names_the_build_command(tmp_path: Path) -> None:
    copies, images = _dirs(tmp_path)
    code, output = _run(tmp_path, tmp_path / "absent.tar", copies, images)
    assert code != 0
    assert "is not on the controller: build it (`llmfleet image build NAME`" in output
