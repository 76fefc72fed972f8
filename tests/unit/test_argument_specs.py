"""Each role's meta/argument_specs.yml describes exactly its defaults/main.yml.

Ansible validates a role's inputs against argument_specs before its first task,
and the README's variable tables are generated from it, so a default missing
from the specs goes unchecked and undocumented, and a spec without a default
documents a variable that does not exist. (prometheus.prometheus runs the same
check in its CI.) Every role under roles/ is covered, present and future.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llmfleet.paths import REPO_ROOT

ROLES = sorted(path.parent.parent for path in (REPO_ROOT / "roles").glob("*/tasks/main.yml"))


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _defaults(role: Path) -> dict[str, Any]:
    return _load(role / "defaults" / "main.yml") or {}


def _options(role: Path) -> dict[str, dict[str, Any]]:
    specs = _load(role / "meta" / "argument_specs.yml")
    assert specs is not None, f"{role.name}: add meta/argument_specs.yml (every role has one)"
    entry = specs.get("argument_specs", {}).get("main")
    assert entry is not None, f"{role.name}: meta/argument_specs.yml needs an `argument_specs: main:` entry point"
    return entry.get("options") or {}


@pytest.fixture(params=ROLES, ids=[role.name for role in ROLES])
def role(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_roles_are_found() -> None:
    assert ROLES, "no roles found under roles/"


def test_specs_and_defaults_have_the_same_keys(role: Path) -> None:
    defaults, options = set(_defaults(role)), set(_options(role))
    # An option without a default must be required: nothing else sets it.
    required = {name for name, option in _options(role).items() if option.get("required")}
    assert not defaults - options, f"{role.name}: defaults missing from argument_specs: {sorted(defaults - options)}"
    assert not options - defaults - required, (
        f"{role.name}: argument_specs options with no default in defaults/main.yml "
        f"(and not `required: true`): {sorted(options - defaults - required)}"
    )


def test_every_option_has_a_description_and_a_type(role: Path) -> None:
    for name, option in _options(role).items():
        assert option.get("description"), f"{role.name}: {name} has no description"
        assert option.get("type"), f"{role.name}: {name} has no type"


def test_documented_defaults_match_the_real_ones(role: Path) -> None:
    # Ansible takes the real default from defaults/main.yml; a `default:` in the
    # specs is documentation, and must not say something else.
    defaults = _defaults(role)
    for name, option in _options(role).items():
        if "default" in option and name in defaults:
            assert option["default"] == defaults[name], (
                f"{role.name}: {name}: argument_specs says {option['default']!r}, defaults/main.yml {defaults[name]!r}"
            )


def test_role_variables_carry_the_role_prefix(role: Path) -> None:
    for name in _options(role):
        assert name.startswith(f"{role.name}_"), f"{role.name}: {name} must start with `{role.name}_`"
