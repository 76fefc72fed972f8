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

SHARED = yaml.safe_load((REPO_ROOT / "molecule" / "config.yml").read_text())
SCENARIOS = sorted(REPO_ROOT.glob("roles/*/molecule/*/molecule.yml"))
# The platform keys molecule/create.yml and destroy.yml read (create.yml's own list).
CREATE_PLAY = yaml.safe_load((REPO_ROOT / "molecule" / "create.yml").read_text())[0]
PLATFORM_KEYS = set(CREATE_PLAY["vars"]["llmfleet_platform_keys"])


def _playbooks(config: dict[str, Any]) -> dict[str, str]:
    return dict((config.get("ansible") or {}).get("playbooks") or {})


def test_there_are_scenarios_to_check() -> None:
    assert len(SCENARIOS) >= 10, SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda path: path.parent.parent.parent.name)
def test_each_scenario_resolves_llmfleets_create_and_destroy(scenario: Path) -> None:
    own = yaml.safe_load(scenario.read_text()) or {}
    # A scenario's molecule.yml is merged over the shared file: its own playbooks, if any, win.
    playbooks = _playbooks(SHARED) | _playbooks(own)
    for step in ("create", "destroy"):
        # What Molecule does (molecule.provisioner.ansible.Ansible.abs_path): the scenario directory joined.
        resolved = (scenario.parent / playbooks[step]).resolve()
        assert resolved == (REPO_ROOT / "molecule" / f"{step}.yml").resolve(), (scenario, step, resolved)
        assert resolved.is_file(), resolved


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda path: path.parent.parent.parent.name)
def test_each_platform_is_one_molecule_create_yml_can_create(scenario: Path) -> None:
    # create.yml builds no image and passes on only the keys it knows (it refuses the rest at run time too);
    # a scenario's own platforms replace the shared ones.
    platforms = (yaml.safe_load(scenario.read_text()) or {}).get("platforms") or SHARED["platforms"]
    assert platforms
    for platform in platforms:
        assert platform.get("pre_build_image") is True, (scenario, platform.get("name"))
        assert set(platform) <= PLATFORM_KEYS, (scenario, set(platform) - PLATFORM_KEYS)
