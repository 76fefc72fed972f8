"""The `llmfleet` command line: one sub-command group per module.

Each module listed in COMMAND_GROUPS exposes `register(subparsers)`, which adds
its parser and sets `handler` to a function taking the parsed namespace and
returning an exit code. Keeping registration beside the code it runs means a
new command touches one file plus one line here. A group whose commands belong
to different parts of the package (`llmfleet model`: the lab's generators and
the operator's checks) is a SharedGroup: each of its modules' `register` adds
its commands to the group's sub-parsers.

The serving commands come with the package itself; the operating ones need the
`ops` extra (pyproject.toml), so the service image, which installs the package
bare, offers only what it serves, and `llmfleet --help` there says so.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from collections.abc import Sequence
from importlib import metadata
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

# What the gateway and worker containers run: llmfleet's own dependencies suffice.
SERVING_GROUPS: tuple[str | SharedGroup, ...] = (
    "llmfleet.serve.gateway.cli",
    "llmfleet.serve.worker.cli",
    "llmfleet.ops.token",
    "llmfleet.ops.usage",
)
# What operates the fleet from a controller: offered where the ops extra is installed.
OPERATING_GROUPS: tuple[str | SharedGroup, ...] = (
    "llmfleet.lab.cli",
    MODEL_COMMANDS,
    "llmfleet.build.wheelhouse",
    "llmfleet.build.roledocs",
    "llmfleet.ops.stack",
    "llmfleet.build.images",
    "llmfleet.serve.scaler.cli",
    "llmfleet.ops.planner",
    "llmfleet.ops.engine",
    "llmfleet.lab.standins",
    "llmfleet.bench.cli",
)


COMMAND_GROUPS = SERVING_GROUPS + OPERATING_GROUPS
OPS_EXTRA_MISSING = (
    "The operating commands (lab, image, wheelhouse, scaler, bench and the rest) come with the ops extra: "
    "pip install 'llmfleet[ops]'."
)


def ops_extra_installed() -> bool:
    """Whether every distribution the `ops` extra names is installed beside llmfleet."""
    try:
        requirements = metadata.requires("llmfleet") or []
    except metadata.PackageNotFoundError:  # run from a checkout without installing it: offer everything
        return True
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        if re.search(r"""extra\s*==\s*["']ops["']""", marker):
            try:
                metadata.version(re.split(r"[\s\[<>=!~]", name.strip(), maxsplit=1)[0])
            except metadata.PackageNotFoundError:
                return False
    return True


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
    if ops_extra_installed():
        groups = COMMAND_GROUPS
    else:
        groups, parser.epilog = SERVING_GROUPS, OPS_EXTRA_MISSING
    for group in groups:
        register_group(subparsers, group)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as refused:
        # An operating command where only the serving ones are offered: say where the rest are.
        if refused.code == 2 and parser.epilog == OPS_EXTRA_MISSING:
            print(f"llmfleet: {OPS_EXTRA_MISSING}", file=sys.stderr)
        raise
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
