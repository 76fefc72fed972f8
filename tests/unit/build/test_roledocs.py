"""The README's role variables are generated; this fails when someone forgets to regenerate."""

from __future__ import annotations

from pathlib import Path

from llmfleet.build.roledocs import BEGIN, END, is_current, render, rewrite
from llmfleet.paths import REPO_ROOT


def test_readme_role_variables_are_current() -> None:
    assert is_current(REPO_ROOT / "README.md", REPO_ROOT / "roles"), "run `llmfleet docs roles`"


def test_every_role_with_specs_is_documented() -> None:
    rendered = render(REPO_ROOT / "roles")
    for specs in (REPO_ROOT / "roles").glob("*/meta/argument_specs.yml"):
        assert f"### `{specs.parent.parent.name}`" in rendered


def test_rewrite_replaces_only_the_marked_section(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: Demo role.\n    options:\n"
        "      demo_port: {type: int, description: Port to listen on.}\n"
        "      demo_token: {type: str, required: true, description: A | piped secret.}\n"
    )
    (role / "defaults" / "main.yml").write_text("demo_port: 8080\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{BEGIN}\nold\n{END}\n\nAfter.\n")
    assert rewrite(readme, tmp_path / "roles") is True
    text = readme.read_text()
    assert text.startswith("# Title\n\n") and text.endswith("\n\nAfter.\n")
    assert "| `demo_port` | int | `8080` | Port to listen on. |" in text
    assert "| `demo_token` | str | `*required*` | A \\| piped secret. |" in text
    assert rewrite(readme, tmp_path / "roles") is False
