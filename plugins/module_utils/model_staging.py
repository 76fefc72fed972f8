# Copyright: llmfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Staging model directories onto hosts: checksum manifests, versioned directories, an atomic `current`.

Stdlib only: the `model_manifest` and `model_release` modules run this on hosts and
on the controller, and tests import it directly.

Layout under a model's staging directory (one per served model):

    versions/<version>/            complete copies, each with MANIFEST_NAME inside
    versions/.<version>.partial/   a transfer in progress; never served
    current -> versions/<version>  what engines mount

A version is named by the digest of its manifest, so the same files always make
the same version and any changed byte makes a new one. A copy is assembled in the
partial directory, checked file by file against the manifest, renamed into place
(rename is atomic on one filesystem) and only then does `current` move, by
renaming a new symlink over it. A failed or interrupted copy therefore leaves the
served version untouched; the next run resumes the partial directory.

Files an older complete version already holds with the same checksum are
hard-linked instead of transferred, so a changed config.json moves one small file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

MANIFEST_NAME = ".llmfleet-manifest.json"
MANIFEST_FORMAT = 1
VERSION_LENGTH = 16
CURRENT = "current"
VERSIONS = "versions"
_CHUNK = 1 << 20


class StagingError(Exception):
    """A staging step that cannot go on; the message says what to do."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(source: str | Path) -> dict[str, Any]:
    """Checksum every file below source, by path relative to it.

    Names starting with a dot (.git, .cache, our own manifest) are left out: they are
    tooling state, not the model. Symlinks to files are followed, since Hugging Face
    cache snapshots are symlinks into a blob store.
    """
    source = Path(source)
    if not source.is_dir():
        raise StagingError(f"model source {source} is not a directory; check the path")
    files: dict[str, dict[str, Any]] = {}
    for directory, subdirectories, names in os.walk(source, followlinks=True):
        subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(directory) / name
            if not path.is_file():
                raise StagingError(f"{path} is not a regular file (a broken link?); fix or remove it")
            files[path.relative_to(source).as_posix()] = {"sha256": file_sha256(path), "size": path.stat().st_size}
    if not files:
        raise StagingError(f"model source {source} holds no files")
    return {"format": MANIFEST_FORMAT, "files": files}


def manifest_version(manifest: dict[str, Any]) -> str:
    """The version name of a manifest: a prefix of the digest of its canonical JSON."""
    canonical = json.dumps(manifest["files"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:VERSION_LENGTH]


def validate_manifest(manifest: Any) -> dict[str, Any]:
    """Refuse a manifest that is not one build_manifest wrote, before it steers any write."""
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise StagingError(f"manifest is not format {MANIFEST_FORMAT}; rebuild it with the model_manifest module")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise StagingError("manifest lists no files")
    for relative, entry in files.items():
        parts = relative.split("/")
        if relative.startswith("/") or ".." in parts or any(part.startswith(".") or not part for part in parts):
            raise StagingError(f"manifest path {relative!r} leaves the model directory or is hidden")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise StagingError(f"manifest entry for {relative} needs sha256 and size")
        if not isinstance(entry.get("size"), int):
            raise StagingError(f"manifest entry for {relative} needs sha256 and size")
    return manifest


def _read_manifest(version_dir: Path) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads((version_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return loaded


def _matches(path: Path, entry: dict[str, Any]) -> bool:
    return path.is_file() and path.stat().st_size == entry["size"] and file_sha256(path) == entry["sha256"]


def current_version(root: str | Path) -> str | None:
    link = Path(root) / CURRENT
    return link.readlink().name if link.is_symlink() else None


def _release_sequence(version_dir: Path) -> int | None:
    stored = _read_manifest(version_dir)
    sequence = stored.get("release_sequence") if stored else None
    return sequence if isinstance(sequence, int) else None


def complete_versions(root: str | Path) -> list[str]:
    """Complete versions, oldest release first.

    Order comes from the sequence number each release writes into its manifest, not
    from mtimes: two releases within one filesystem clock tick share an mtime.
    """
    versions_dir = Path(root) / VERSIONS
    if not versions_dir.is_dir():
        return []
    found = []
    for version_dir in versions_dir.iterdir():
        sequence = None if version_dir.name.startswith(".") else _release_sequence(version_dir)
        if sequence is not None:
            found.append((sequence, version_dir.name))
    return [name for _, name in sorted(found)]


def _donors(root: Path) -> dict[str, Path]:
    """sha256 -> a file in a complete version holding that content, for hard links."""
    donors: dict[str, Path] = {}
    for version in complete_versions(root):
        version_dir = root / VERSIONS / version
        stored = _read_manifest(version_dir) or {"files": {}}
        for relative, entry in stored["files"].items():
            path = version_dir / relative
            if path.is_file() and path.stat().st_size == entry["size"]:
                donors.setdefault(entry["sha256"], path)
    return donors


def _paths(root: str | Path, version: str) -> tuple[Path, Path]:
    """The version's final directory and the partial one a transfer writes into."""
    versions_dir = Path(root) / VERSIONS
    return versions_dir / version, versions_dir / f".{version}.partial"


def prepare(root: str | Path, manifest: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    """Make versions/.<version>.partial ready to receive the files only the source has.

    Returns version, complete (the version is already staged), needed (relative paths
    to transfer), linked (paths taken from older versions by hard link) and changed.
    """
    validate_manifest(manifest)
    version = manifest_version(manifest)
    final, partial = _paths(root, version)
    result: dict[str, Any] = {
        "version": version,
        "partial": str(partial),
        "path": str(final),
        "needed": [],
        "linked": [],
    }
    stored = _read_manifest(final)
    if stored is not None:
        if stored.get("files") != manifest["files"]:
            raise StagingError(f"{final} holds another manifest than its name says; move it aside and rerun")
        return {**result, "complete": True, "changed": False}
    donors = _donors(Path(root))
    changed = not partial.is_dir()
    for relative, entry in sorted(manifest["files"].items()):
        target = partial / relative
        if _matches(target, entry):
            continue  # resumed: this file arrived in an earlier, interrupted run
        donor = donors.get(entry["sha256"])
        if not check_mode:
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if donor is None:
            result["needed"].append(relative)
            continue
        result["linked"].append(relative)
        changed = True
        if not check_mode:
            target.unlink(missing_ok=True)
            target.hardlink_to(donor)
    if not check_mode:
        partial.mkdir(mode=0o755, parents=True, exist_ok=True)
    return {**result, "complete": False, "changed": changed}


def _verify_partial(partial: Path, manifest: dict[str, Any]) -> None:
    problems = []
    for relative, entry in sorted(manifest["files"].items()):
        path = partial / relative
        if not path.is_file():
            problems.append(f"{relative}: missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"{relative}: {path.stat().st_size} bytes, manifest says {entry['size']}")
        elif file_sha256(path) != entry["sha256"]:
            problems.append(f"{relative}: sha256 differs from the manifest")
    if problems:
        raise StagingError(
            f"{partial} does not match the manifest ({'; '.join(problems)});"
            " the served version is unchanged. Rerun to resume the transfer"
        )


def _fsync_tree(path: Path) -> None:
    """Flush the copy to disk before the rename makes it servable."""
    for directory, _, names in os.walk(path):
        for name in names:
            with (Path(directory) / name).open("rb") as handle:
                os.fsync(handle.fileno())
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def release(root: str | Path, manifest: dict[str, Any], keep: int, check_mode: bool = False) -> dict[str, Any]:
    """Seal the partial copy as a version, point `current` at it, prune old versions.

    Only a copy that matches the manifest file by file is sealed; `current` moves by
    renaming a fresh symlink over it, so readers see the old or the new, never neither.
    """
    validate_manifest(manifest)
    if keep < 1:
        raise StagingError(f"keep must be at least 1 (the served version), got {keep}")
    root = Path(root)
    version = manifest_version(manifest)
    final, partial = _paths(root, version)
    previous = current_version(root)
    changed = False
    if _read_manifest(final) is None:
        if final.exists() or final.is_symlink():
            raise StagingError(f"{final} exists but is no staged version (no {MANIFEST_NAME}); move it aside and rerun")
        changed = True
        if check_mode:
            return _released(version, previous, final, changed, pruned=[])
        _verify_partial(partial, manifest)
        released = [_release_sequence(root / VERSIONS / name) or 0 for name in complete_versions(root)]
        stored = {**manifest, "release_sequence": max(released, default=0) + 1}
        (partial / MANIFEST_NAME).write_text(json.dumps(stored, sort_keys=True, indent=1))
        _fsync_tree(partial)
        partial.rename(final)
    if previous != version:
        changed = True
        if not check_mode:
            fresh_link = root / f".{CURRENT}.new"
            fresh_link.unlink(missing_ok=True)
            fresh_link.symlink_to(Path(VERSIONS) / version)
            fresh_link.replace(root / CURRENT)
    pruned = prune(root, keep, version, check_mode)
    return _released(version, previous, final, changed or bool(pruned), pruned)


def _released(version: str, previous: str | None, final: Path, changed: bool, pruned: list[str]) -> dict[str, Any]:
    return {"version": version, "previous": previous, "path": str(final), "changed": changed, "pruned": pruned}


def prune(root: str | Path, keep: int, serving: str, check_mode: bool = False) -> list[str]:
    """Delete all but the `keep` newest complete versions (never `serving`) and stale partial copies."""
    versions_dir = Path(root) / VERSIONS
    older = [version for version in complete_versions(root) if version != serving]
    doomed = older[: max(0, len(older) - (keep - 1))]
    doomed += sorted(
        path.name
        for path in versions_dir.iterdir()
        if path.name.startswith(".") and path.name.endswith(".partial") and path.name != f".{serving}.partial"
    )
    if not check_mode:
        for name in doomed:
            shutil.rmtree(versions_dir / name)
    return doomed
