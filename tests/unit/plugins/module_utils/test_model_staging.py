"""plugins/module_utils/model_staging.py: versioned copies, hard links, atomic current.

The transfer between prepare and release is what the role's copy task does; here
a plain file copy stands in for it, so each case runs in milliseconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from llmfleet.module_utils.model_staging import (
    MANIFEST_NAME,
    StagingError,
    build_manifest,
    current_version,
    manifest_version,
    prepare,
    release,
)


def _model(directory: Path, config: dict[str, Any] | None = None, weights: bytes = b"w" * 64) -> Path:
    (directory / "tokenizer").mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config or {"rope_theta": 10000.0}))
    (directory / "model.safetensors").write_bytes(weights)
    (directory / "tokenizer" / "tokenizer.json").write_text("{}")
    (directory / ".git").mkdir()
    (directory / ".git" / "HEAD").write_text("ref")
    return directory


def _stage(root: Path, source: Path, keep: int = 2) -> tuple[dict[str, Any], dict[str, Any]]:
    """prepare, transfer what is needed (a plain copy), release: one run of the role."""
    manifest = build_manifest(source)
    prepared = prepare(root, manifest)
    for relative in prepared["needed"]:
        shutil.copyfile(source / relative, Path(prepared["partial"]) / relative)
    return prepared, release(root, manifest, keep)


def test_manifest_lists_every_file_but_hidden_ones(tmp_path: Path) -> None:
    manifest = build_manifest(_model(tmp_path / "src"))
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert manifest["files"]["model.safetensors"]["size"] == 64


def test_version_follows_content_not_timestamps(tmp_path: Path) -> None:
    one = build_manifest(_model(tmp_path / "one"))
    two = build_manifest(_model(tmp_path / "two"))
    changed = build_manifest(_model(tmp_path / "three", config={"rope_theta": 1000000.0}))
    assert manifest_version(one) == manifest_version(two) != manifest_version(changed)


def test_first_stage_transfers_everything_and_serves_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    prepared, released = _stage(root, _model(tmp_path / "src"))
    assert prepared["needed"] == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert released["previous"] is None
    assert (root / "current").readlink() == Path("versions") / released["version"]
    assert (root / "current" / "model.safetensors").read_bytes() == b"w" * 64
    assert not list((root / "versions").glob(".*"))


def test_rerun_changes_nothing(tmp_path: Path) -> None:
    root, source = tmp_path / "root", _model(tmp_path / "src")
    _stage(root, source)
    manifest = build_manifest(source)
    again = prepare(root, manifest)
    assert again["complete"] is True
    assert again["changed"] is False
    assert again["needed"] == []
    assert release(root, manifest, keep=2)["changed"] is False


def test_changed_config_transfers_one_file_and_links_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _, first = _stage(root, _model(tmp_path / "v1"))
    prepared, second = _stage(root, _model(tmp_path / "v2", config={"rope_theta": 1000000.0}))
    assert prepared["needed"] == ["config.json"]
    assert prepared["linked"] == ["model.safetensors", "tokenizer/tokenizer.json"]
    assert second["previous"] == first["version"]
    weights = [root / "versions" / version / "model.safetensors" for version in (first["version"], second["version"])]
    assert weights[0].stat().st_ino == weights[1].stat().st_ino


def test_incomplete_copy_is_refused_and_current_stays(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _, served = _stage(root, _model(tmp_path / "v1"))
    source = _model(tmp_path / "v2", weights=b"x" * 64)
    manifest = build_manifest(source)
    prepared = prepare(root, manifest)
    shutil.copyfile(source / "config.json", Path(prepared["partial"]) / "config.json")  # weights never arrive
    with pytest.raises(StagingError, match=r"model.safetensors: missing.*served version is unchanged"):
        release(root, manifest, keep=2)
    assert current_version(root) == served["version"]
    assert (root / "current" / "model.safetensors").read_bytes() == b"w" * 64


def test_corrupt_copy_is_refused(tmp_path: Path) -> None:
    root, source = tmp_path / "root", _model(tmp_path / "src")
    manifest = build_manifest(source)
    prepared = prepare(root, manifest)
    for relative in prepared["needed"]:
        shutil.copyfile(source / relative, Path(prepared["partial"]) / relative)
    (Path(prepared["partial"]) / "model.safetensors").write_bytes(b"v" * 64)  # same size, other bytes
    with pytest.raises(StagingError, match=r"model\.safetensors: sha256 differs"):
        release(root, manifest, keep=2)
    assert current_version(root) is None


def test_interrupted_copy_resumes(tmp_path: Path) -> None:
    root, source = tmp_path / "root", _model(tmp_path / "src")
    manifest = build_manifest(source)
    prepared = prepare(root, manifest)
    shutil.copyfile(source / "model.safetensors", Path(prepared["partial"]) / "model.safetensors")
    resumed = prepare(root, manifest)
    assert resumed["needed"] == ["config.json", "tokenizer/tokenizer.json"]


def test_keep_prunes_oldest_but_never_the_served_version(tmp_path: Path) -> None:
    root = tmp_path / "root"
    versions = [_stage(root, _model(tmp_path / f"v{n}", config={"n": n}))[1]["version"] for n in range(3)]
    remaining = sorted(path.name for path in (root / "versions").iterdir())
    assert remaining == sorted(versions[1:])
    _, last = _stage(root, _model(tmp_path / "v3", config={"n": 3}), keep=1)
    assert [path.name for path in (root / "versions").iterdir()] == [last["version"]]
    assert sorted(last["pruned"]) == sorted(versions[1:])


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    root, source = tmp_path / "root", _model(tmp_path / "src")
    manifest = build_manifest(source)
    prepared = prepare(root, manifest, check_mode=True)
    released = release(root, manifest, keep=2, check_mode=True)
    assert prepared["changed"] is True
    assert len(prepared["needed"]) == 3
    assert released["changed"] is True
    assert not root.exists()


def test_stale_directory_without_manifest_is_not_overwritten(tmp_path: Path) -> None:
    root, source = tmp_path / "root", _model(tmp_path / "src")
    manifest = build_manifest(source)
    squatter = root / "versions" / manifest_version(manifest)
    squatter.mkdir(parents=True)
    (squatter / "keep-me").write_text("operator data")
    prepared = prepare(root, manifest)
    for relative in prepared["needed"]:
        shutil.copyfile(source / relative, Path(prepared["partial"]) / relative)
    with pytest.raises(StagingError, match=r"no staged version.*move it aside"):
        release(root, manifest, keep=2)
    assert (squatter / "keep-me").read_text() == "operator data"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"../etc/passwd": {"sha256": "0", "size": 1}}, "leaves the model directory"),
        ({"/etc/passwd": {"sha256": "0", "size": 1}}, "leaves the model directory"),
        ({MANIFEST_NAME: {"sha256": "0", "size": 1}}, "hidden"),
        ({"config.json": {"sha256": "0"}}, "needs sha256 and size"),
        ({}, "lists no files"),
    ],
)
def test_bad_manifest_is_refused_before_any_write(tmp_path: Path, files: dict[str, Any], message: str) -> None:
    with pytest.raises(StagingError, match=message):
        prepare(tmp_path / "root", {"format": 1, "files": files})
    assert not (tmp_path / "root").exists()


def test_missing_or_empty_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="is not a directory"):
        build_manifest(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StagingError, match="holds no files"):
        build_manifest(tmp_path / "empty")
