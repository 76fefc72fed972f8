"""requirements.yml must name the collection versions the pinned `ansible` package bundles."""

from __future__ import annotations

import json
from pathlib import Path

import ansible_collections
import yaml

from llmfleet.paths import REPO_ROOT


def bundled_version(name: str) -> str:
    namespace, collection = name.split(".")
    root = Path(next(iter(ansible_collections.__path__)))
    manifest = json.loads((root / namespace / collection / "MANIFEST.json").read_text())
    return str(manifest["collection_info"]["version"])


def test_requirements_match_the_bundled_collections() -> None:
    requirements = yaml.safe_load((REPO_ROOT / "requirements.yml").read_text())["collections"]
    assert requirements, "requirements.yml lists no collection"
    for entry in requirements:
        assert str(entry["version"]) == bundled_version(entry["name"]), entry["name"]
