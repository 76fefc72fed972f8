"""docs/cli.md's command reference is generated from the argument parsers; these fail
when someone adds or changes a command and forgets to regenerate it, and when the
page would differ between machines."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet import cli
from llmfleet.build import clidocs
from llmfleet.build.clidocs import BEGIN, COMMAND, END, PAGE
from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT


def _registered(parser: argparse.ArgumentParser, words: tuple[str, ...] = ("llmfleet",)) -> Iterator[str]:
    """Every command the parser accepts, read from argparse itself rather than from clidocs."""
    yield " ".join(words)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _registered(sub, (*words, name))


def _generated() -> str:
    text = (REPO_ROOT / PAGE).read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{PAGE}: keep the markers {BEGIN} and {END}"
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def test_generated_command_reference_is_current() -> None:
    assert not clidocs.is_stale(REPO_ROOT), f"{PAGE}: the command reference is stale: run `.venv/bin/{COMMAND}`"


def test_the_check_command_passes_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["docs", "cli", "--check"]) == 0
    assert "is current" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(set(_registered(cli.build_parser()))))
def test_every_registered_command_has_a_section(command: str) -> None:
    assert f"\n### `{command}`\n" in _generated(), f"{PAGE} lacks `{command}`: run `.venv/bin/{COMMAND}`"


def test_the_commands_the_hand_written_page_missed_are_there() -> None:
    generated = _generated()
    for command in ("llmfleet scaler serve", "llmfleet engine metrics", "llmfleet token revoke", "llmfleet docs cli"):
        assert f"### `{command}`" in generated


def test_every_option_appears_with_its_command() -> None:
    sections = {
        section.split("`", 1)[0]: section for section in _generated().split("\n### `llmfleet")[1:]
    }
    missing = []
    for command in clidocs.load_commands():
        section = sections[command.name.removeprefix("llmfleet")]
        missing += [
            f"{command.name} {argument.name}"
            for argument in command.arguments
            if argument.name.replace("|", "\\|") not in section
        ]
    assert not missing, f"{PAGE}: arguments missing from their command's table: {missing}"


def test_the_page_does_not_depend_on_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = clidocs.render(clidocs.load_commands())
    monkeypatch.setenv("COLUMNS", "250")
    assert clidocs.render(clidocs.load_commands()) == narrow


def test_defaults_inside_the_repository_read_the_same_in_any_clone() -> None:
    generated = _generated()
    assert str(REPO_ROOT) not in generated
    assert "`inventories/lab/hosts.yml`" in generated  # `llmfleet lab --inventory`'s default


def test_a_demo_parser_renders_its_arguments_defaults_and_subcommands() -> None:
    parser = argparse.ArgumentParser(prog="llmfleet", description="Top.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="a demo group")
    demo.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "x.json", help="write here (default %(default)s)")
    load = demo.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="open loop")
    load.add_argument("--concurrency", type=int, help="closed loop, 50%% of the time")
    demo.add_argument("--secret", help=argparse.SUPPRESS)
    actions = demo.add_subparsers(dest="action")
    actions.add_parser("run", help="run it | now")

    rendered = clidocs.render(clidocs.load_commands(parser))

    assert [line for line in rendered.splitlines() if line.startswith("### ")] == [
        "### `llmfleet`", "### `llmfleet demo`", "### `llmfleet demo run`"
    ]
    assert "| `--out OUT` | `out/x.json` | write here (default out/x.json) |" in rendered
    assert "| `--rate RATE` | *required*: one of `--rate`, `--concurrency` | open loop |" in rendered
    assert "closed loop, 50% of the time" in rendered
    assert "--secret" not in rendered and "--help" not in rendered
    assert "Subcommands: [`run`](#llmfleet-demo-run)." in rendered
    assert "run it \\| now" in rendered


def test_a_page_without_markers_is_refused(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / PAGE).write_text("# The `llmfleet` command\n")
    with pytest.raises(LlmfleetError, match="cli:begin"):
        clidocs.expected(tmp_path)


def test_write_replaces_only_the_generated_part(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / PAGE).write_text(f"# Intro kept\n\n{BEGIN}\nold\n{END}\n\nTail kept.\n")
    assert clidocs.write(tmp_path)
    text = (tmp_path / PAGE).read_text()
    assert text.startswith("# Intro kept\n\n") and text.endswith(f"{END}\n\nTail kept.\n")
    assert "\nold\n" not in text and "### `llmfleet scaler`" in text
    assert not clidocs.write(tmp_path)
