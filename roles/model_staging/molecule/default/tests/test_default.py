"""What an operator finds on the host after converge and side_effect.yml.

converge.yml staged tiny-v1 from the controller, and from a store on the host as
tiny-from-store. side_effect.yml staged tiny-v2 (config.json changed), failed to
stage tiny-v3 on a full filesystem, grew it and staged tiny-v3. With
model_staging_keep at 2, v2 and v3 remain and v3 is served.
"""

from __future__ import annotations

import json

import pytest

ROOT = "/srv/llmfleet/models/tiny"
MANIFEST = ".llmfleet-manifest.json"


@pytest.fixture(scope="module")
def versions(host) -> list[str]:
    return sorted(host.check_output(f"ls -A {ROOT}/versions").split())


def test_current_is_a_relative_link_to_a_kept_version(host, versions) -> None:
    current = host.file(f"{ROOT}/current")
    assert current.is_symlink
    target = current.linked_to
    assert target.startswith(f"{ROOT}/versions/")
    assert target.rsplit("/", 1)[1] in versions
    assert host.check_output(f"readlink {ROOT}/current").startswith("versions/")


def test_two_versions_kept_and_no_partial_copy_left(versions) -> None:
    assert len(versions) == 2, versions
    assert not [name for name in versions if name.startswith(".")]


def test_current_serves_v3(host) -> None:
    config = json.loads(host.file(f"{ROOT}/current/config.json").content_string)
    assert config["rope_theta"] == 500000.0
    assert host.file(f"{ROOT}/current/extra-weights.bin").size == 4 * 1024 * 1024


def test_every_file_matches_its_manifest(host, versions) -> None:
    for version in versions:
        manifest = json.loads(host.file(f"{ROOT}/versions/{version}/{MANIFEST}").content_string)
        for relative, entry in manifest["files"].items():
            staged = host.file(f"{ROOT}/versions/{version}/{relative}")
            assert staged.sha256sum == entry["sha256"], (version, relative)
            assert (staged.user, staged.group, staged.mode) == ("root", "root", 0o644), (version, relative)


def test_unchanged_weights_are_shared_not_copied(host, versions) -> None:
    inodes = {host.check_output(f"stat -c %i {ROOT}/versions/{version}/model.safetensors") for version in versions}
    assert len(inodes) == 1


def test_model_from_the_host_store_is_staged_whole(host) -> None:
    root = "/srv/llmfleet/models/tiny-from-store"
    manifest = json.loads(host.file(f"{root}/current/{MANIFEST}").content_string)
    assert set(manifest["files"]) == set(host.check_output("cd /srv/model-store/tiny && ls -A").split())
    for relative, entry in manifest["files"].items():
        assert host.file(f"{root}/current/{relative}").sha256sum == entry["sha256"], relative
        assert host.file(f"/srv/model-store/tiny/{relative}").sha256sum == entry["sha256"], relative
