"""The role documentation is generated from argument_specs; these fail when someone
forgets to regenerate it, when a role lacks its README, or when a README's
hand-written example stops matching the role it shows."""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.build import roledocs
from llmfleet.build.roledocs import BEGIN, COMMAND, END, README_BEGIN, README_END, load_roles, stale, write
from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT

ROLES = sorted(path.parent.parent.name for path in (REPO_ROOT / "roles").glob("*/tasks/main.yml"))


def test_generated_role_docs_are_current() -> None:
    outdated = [str(path.relative_to(REPO_ROOT)) for path in stale(REPO_ROOT)]
    assert not outdated, f"missing or stale: {outdated}: run `.venv/bin/{COMMAND}` and commit the result"


@pytest.mark.parametrize("role", ROLES)
def test_every_role_has_a_readme_and_a_reference_section(role: str) -> None:
    readme = REPO_ROOT / "roles" / role / "README.md"
    assert readme.is_file(), f"roles/{role} has no README.md: run `.venv/bin/{COMMAND}` to create it"
    assert f"### `{role}`" in (REPO_ROOT / "docs" / "roles.md").read_text(), f"run `.venv/bin/{COMMAND}`"


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_example_applies_the_role_with_its_own_variables(role: str) -> None:
    readme = REPO_ROOT / "roles" / role / "README.md"
    assert readme.is_file(), f"roles/{role} has no README.md: run `.venv/bin/{COMMAND}` to create it"
    text = readme.read_text()
    assert "\n## Example\n" in text, f"roles/{role}/README.md: keep its `## Example` section"
    example = text.split("\n## Example\n", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", example, flags=re.DOTALL)
    assert blocks, f"roles/{role}/README.md: the example needs a ```yaml play"
    options = _options()[role]
    applied = False
    for block in blocks:
        plays = yaml.safe_load(block)
        assert isinstance(plays, list), f"roles/{role}/README.md: the example is a list of plays"
        for play in plays:
            for entry in play.get("roles", []):
                if entry.get("role") != role:
                    continue
                applied = True
                unknown = sorted(
                    name for name in _keys(play.get("vars"), entry.get("vars"))
                    if name.startswith(f"{role}_") and name not in options
                )
                assert not unknown, f"roles/{role}/README.md: the example sets variables the role lacks: {unknown}"
    assert applied, f"roles/{role}/README.md: the example must apply `role: {role}`"


@functools.cache
def _options() -> dict[str, set[str]]:
    return {role.name: set(role.options) for role in load_roles(REPO_ROOT)}


def _keys(*mappings: Any) -> set[str]:
    return {str(key) for mapping in mappings if isinstance(mapping, dict) for key in mapping}


def _demo_repo(tmp_path: Path) -> Path:
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "tasks").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: Demo role.\n"
        "    description: [Does one thing. Then stops.]\n    options:\n"
        "      demo_port: {type: int, description: Port to listen on. Also the metrics port.}\n"
        "      demo_token: {type: str, required: true, description: A | piped secret.}\n"
    )
    (role / "defaults" / "main.yml").write_text("demo_port: 8080\n")
    (role / "tasks" / "main.yml").write_text("- name: Nothing\n  ansible.builtin.meta: noop\n")
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "demo.yml").write_text(
        "- name: Demo\n  hosts: \"{{ demo_hosts | default('demos') }}\"\n  roles:\n    - role: demo\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "roles.md").write_text(f"# Roles\n\nBy hand.\n\n{BEGIN}\nold\n{END}\n\nAfter.\n")
    return tmp_path


def test_write_creates_a_readme_and_keeps_hand_written_text(tmp_path: Path) -> None:
    repo = _demo_repo(tmp_path)
    readme = repo / "roles" / "demo" / "README.md"
    assert stale(repo) == [repo / "docs" / "roles.md", readme]
    write(repo)
    reference = (repo / "docs" / "roles.md").read_text()
    assert reference.startswith("# Roles\n\nBy hand.\n\n") and reference.endswith("\n\nAfter.\n")
    assert "| `demo_port` | int | `8080` | Port to listen on. Also the metrics port. |" in reference
    assert "| `demo_token` | str | `*required*` | A \\| piped secret. |" in reference
    index_row = "| [`demo`](../roles/demo/README.md) | Demo role. | [`playbooks/demo.yml`](../playbooks/demo.yml) |"
    assert index_row in reference
    text = readme.read_text()
    # The README's table keeps the first sentence; the reference has it all.
    assert "| `demo_port` | `8080` | Port to listen on. |" in text
    applied = "Applied by [`playbooks/demo.yml`](../../playbooks/demo.yml) on `{{ demo_hosts | default('demos') }}`."
    assert applied in text
    # The new README's example play is YAML even with a Jinja hosts pattern.
    play = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)[0])
    assert play[0]["hosts"] == "{{ demo_hosts | default('demos') }}" and play[0]["roles"][0]["role"] == "demo"
    assert "No Molecule scenario applies it" in text
    assert "demo_token: CHANGE-ME  # required" in text
    assert write(repo) == [] and stale(repo) == []

    # The author's example survives a change to the specs; the generated part follows it.
    readme.write_text(text.replace("demo_token: CHANGE-ME  # required", "demo_token: from-the-vault"))
    specs = repo / "roles" / "demo" / "meta" / "argument_specs.yml"
    specs.write_text(specs.read_text().replace("Port to listen on.", "TCP port."))
    assert stale(repo) == [repo / "docs" / "roles.md", readme]
    write(repo)
    text = readme.read_text()
    assert "| `demo_port` | `8080` | TCP port. |" in text and "demo_token: from-the-vault" in text
    assert text.count(README_BEGIN) == 1 and text.count(README_END) == 1


def test_a_new_role_makes_the_check_fail_naming_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _demo_repo(tmp_path)
    write(repo)
    second = repo / "roles" / "second"
    (second / "meta").mkdir(parents=True)
    (second / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: Second.\n    options: {}\n"
    )
    monkeypatch.setattr(roledocs, "REPO_ROOT", repo)
    with pytest.raises(LlmfleetError, match=rf"roles/second/README.md(.|\n)*run `{COMMAND}`"):
        roledocs._roles(argparse.Namespace(check=True))
    assert roledocs._roles(argparse.Namespace(check=False)) == 0
    assert roledocs._roles(argparse.Namespace(check=True)) == 0


@pytest.mark.parametrize("broken", ["docs/roles.md", "roles/demo/README.md"])
def test_a_file_without_its_markers_is_refused(tmp_path: Path, broken: str) -> None:
    repo = _demo_repo(tmp_path)
    write(repo)
    (repo / broken).write_text("# Hand-written, markers lost\n")
    with pytest.raises(LlmfleetError, match="lacks the markers"):
        stale(repo)
