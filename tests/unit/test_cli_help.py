"""Every `llmfleet` command's --help renders: argparse expands % in help texts, so a stray one crashes it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from llmfleet.cli import build_parser


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Each command's words and its rendered help, the top level first."""
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def test_every_command_renders_its_help() -> None:
    rendered = dict(commands(build_parser()))
    assert ("bench", "compare") in rendered and len(rendered) > 10
    # A help text that meant a literal percent sign shows it once.
    assert "under 95% of the offered rate" in " ".join(rendered[("bench", "compare")].split())
