"""`llmfleet image build` keeps the newest KEEP_BUILDS builds of an image and prunes the rest.

The docker CLI is a FAKE here (a recorder standing in for `docker image ls/rm`):
what is tested is which archives, tags and build stages are chosen, on real files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llmfleet.build import images

RECIPE = images.RECIPES["service"]


class FakeDocker:
    """FAKE docker CLI: answers `image ls` from lists, records `image rm`, refuses the references in `in_use`."""

    def __init__(self, tags: list[str], stages: list[str], in_use: frozenset[str] = frozenset()) -> None:
        self.tags, self.stages, self.in_use = tags, stages, in_use
        self.removed: list[str] = []

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("image", "ls"):
            listed = self.stages if "dangling=true" in args else self.tags
            return subprocess.CompletedProcess(["docker", *args], 0, "\n".join(listed) + "\n", "")
        if args[:2] == ("image", "rm"):
            if args[2] in self.in_use:
                return subprocess.CompletedProcess(["docker", *args], 1, "", f"conflict: {args[2]} is in use")
            self.removed.append(args[2])
            return subprocess.CompletedProcess(["docker", *args], 0, "", "")
        raise AssertionError(f"unexpected docker call: {args}")


def archives(directory: Path, keys: list[str]) -> list[Path]:
    """One archive per key, the first key the oldest."""
    made = []
    for age, key in enumerate(reversed(keys)):
        path = directory / f"{RECIPE.name}-{RECIPE.version}-{key}.tar"
        path.write_bytes(b"archive")
        stamp = 1_700_000_000 - 1000 * age
        os.utime(path, (stamp, stamp))
        made.append(path)
    return list(reversed(made))


def tag(key: str) -> str:
    return f"{RECIPE.repository}:{RECIPE.version}-{key}"


def test_keeps_the_current_build_and_the_one_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    oldest, older, previous, current = archives(tmp_path, ["aaa", "bbb", "ccc", "ddd"])
    link = tmp_path / f"{RECIPE.name}.tar"
    link.symlink_to(current.name)
    fake = FakeDocker(tags=[tag(k) for k in ("ddd", "ccc", "bbb", "aaa")], stages=["s4", "s3", "s2"])
    monkeypatch.setattr(images, "docker", fake)

    removed = images.prune_old_builds(RECIPE, images.BuiltImage(tag("ddd"), current))

    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([previous.name, current.name, link.name])
    assert fake.removed == [tag("bbb"), tag("aaa"), "s3", "s2"]
    assert removed == [str(older), str(oldest), tag("bbb"), tag("aaa"), "s3", "s2"]


def test_a_reused_older_build_becomes_the_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Checking out an older commit reuses its archive: it counts as just used, and
    # the build that was newest stays as the one before.
    oldest, middle, newest = archives(tmp_path, ["aaa", "bbb", "ccc"])
    fake = FakeDocker(tags=[tag(k) for k in ("ccc", "bbb", "aaa")], stages=[])
    monkeypatch.setattr(images, "docker", fake)

    images.prune_old_builds(RECIPE, images.BuiltImage(tag("aaa"), oldest))

    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([oldest.name, newest.name])
    assert fake.removed == [tag("bbb")]
    assert not middle.exists()


def test_a_tag_in_use_is_kept_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, previous, current = archives(tmp_path, ["aaa", "bbb", "ccc"])
    fake = FakeDocker(tags=[tag(k) for k in ("ccc", "bbb", "aaa")], stages=[], in_use=frozenset({tag("aaa")}))
    monkeypatch.setattr(images, "docker", fake)

    removed = images.prune_old_builds(RECIPE, images.BuiltImage(tag("ccc"), current))

    assert tag("aaa") not in removed
    assert fake.removed == []
    assert f"kept {tag('aaa')}: conflict" in caplog.text
    assert previous.exists() and current.exists()


def test_nothing_to_prune_removes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (current,) = archives(tmp_path, ["aaa"])
    fake = FakeDocker(tags=[tag("aaa")], stages=["s1"])
    monkeypatch.setattr(images, "docker", fake)

    assert images.prune_old_builds(RECIPE, images.BuiltImage(tag("aaa"), current)) == []
    assert current.exists()
    assert fake.removed == []


def test_the_service_build_stage_carries_the_label_the_prune_looks_for() -> None:
    dockerfile = (images.IMAGES_DIR / RECIPE.name / "Dockerfile").read_text()
    build_stage = dockerfile.split("AS build", 1)[1].split("\nFROM ", 1)[0]
    assert f"LABEL {images.BUILD_STAGE_LABEL}={RECIPE.name}" in build_stage
