"""Every Molecule scenario runs llmfleet's own create and destroy playbooks (molecule/create.yml says why).

Molecule reads a playbook path relative to the scenario's directory and, when nothing is there, falls back to the
driver's bundled playbook without a word: a scenario moved one directory deeper would quietly get the slow ones back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

SHARED_CONFIG = REPO_ROOT / "molecule" / "config.yml"
SCENARIOS = sorted(REPO_ROOT.glob("roles/*/molecule/*/molecule.yml"))


def _playbooks(config: dict[str, Any]) -> dict[str, str]:
    return dict((config.get("ansible") or {}).get("playbooks") or {})


def test_there_are_scenarios_to_check() -> None:
    assert len(SCENARIOS) >= 10, SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda path: path.parent.parent.parent.name)
def test_each_scenario_resolves_llmfleets_create_and_destroy(scenario: Path) -> None:
    shared = _playbooks(yaml.safe_load(SHARED_CONFIG.read_text()))
    own = yaml.safe_load(scenario.read_text()) or {}
    # A scenario's molecule.yml is merged over the shared file: its own playbooks, if any, win.
    playbooks = shared | _playbooks(own)
    for step in ("create", "destroy"):
        # What Molecule does (molecule.provisioner.ansible.Ansible.abs_path): the scenario directory joined.
        resolved = (scenario.parent / playbooks[step]).resolve()
        assert resolved == (REPO_ROOT / "molecule" / f"{step}.yml").resolve(), (scenario, step, resolved)
        assert resolved.is_file(), resolved


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda path: path.parent.parent.parent.name)
def test_each_platform_runs_a_prebuilt_image(scenario: Path) -> None:
    # molecule/create.yml builds no image; a scenario's own platforms replace the shared ones.
    platforms = (yaml.safe_load(scenario.read_text()) or {}).get("platforms") or \
        yaml.safe_load(SHARED_CONFIG.read_text())["platforms"]
    assert platforms
    for platform in platforms:
        assert platform.get("pre_build_image") is True, (scenario, platform.get("name"))
