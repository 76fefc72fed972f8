"""The `llmfleet` command line: one sub-command group per module.

Each module listed in COMMAND_GROUPS exposes `register(subparsers)`, which adds
its parser and sets `handler` to a function taking the parsed namespace and
returning an exit code. Keeping registration beside the code it runs means a
new command touches one file plus one line here. A group whose commands belong
to different parts of the package (`llmfleet model`: the lab's generators and
the operator's checks) is a SharedGroup: each of its modules' `register` adds
its commands to the group's sub-parsers.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NamedTuple

from llmfleet import __version__
from llmfleet.errors import LlmfleetError


class SharedGroup(NamedTuple):
    """A sub-command group whose commands live in several modules."""

    name: str
    help: str
    modules: tuple[str, ...]


MODEL_COMMANDS = SharedGroup(
    "model",
    "make and inspect model directories",
    ("llmfleet.lab.tiny_cli", "llmfleet.ops.model"),
)

COMMAND_GROUPS: tuple[str | SharedGroup, ...] = (
    "llmfleet.lab.cli",
    MODEL_COMMANDS,
    "llmfleet.build.wheelhouse",
    "llmfleet.build.roledocs",
    "llmfleet.ops.stack",
    "llmfleet.build.images",
    "llmfleet.serve.gateway.cli",
    "llmfleet.serve.worker.cli",
    "llmfleet.serve.scaler.cli",
    "llmfleet.ops.token",
    "llmfleet.ops.planner",
    "llmfleet.ops.engine",
    "llmfleet.lab.standins",
    "llmfleet.bench.loadgen",
)


def register_group(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], group: str | SharedGroup) -> None:
    """Add one entry of COMMAND_GROUPS: a module's own group, or a group shared by several modules."""
    if isinstance(group, str):
        importlib.import_module(group).register(subparsers)
        return
    shared = subparsers.add_parser(group.name, help=group.help)
    commands = shared.add_subparsers(dest=f"{group.name}_command", required=True, metavar="SUBCOMMAND")
    for module_name in group.modules:
        importlib.import_module(module_name).register(commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmfleet",
        description="Serve fine-tuned LLMs with vLLM on bare-metal GPU hosts.",
    )
    parser.add_argument("--version", action="version", version=f"llmfleet {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        register_group(subparsers, group)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        exit_code: int = args.handler(args)
    except LlmfleetError as error:
        print(f"llmfleet: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    return exit_code
