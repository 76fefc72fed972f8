"""The `llmfleet` command line: one sub-command group per module.

Each module listed in COMMAND_GROUPS exposes `register(subparsers)`, which adds
its parser and sets `handler` to a function taking the parsed namespace and
returning an exit code. Keeping registration beside the code it runs means a
new command touches one file plus one line here.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from llmfleet import __version__
from llmfleet.errors import LlmfleetError

COMMAND_GROUPS = (
    "llmfleet.lab.cli",
    "llmfleet.model.cli",
    "llmfleet.wheelhouse",
    "llmfleet.roledocs",
    "llmfleet.stack",
    "llmfleet.images",
    "llmfleet.gateway.cli",
    "llmfleet.worker.cli",
    "llmfleet.token",
    "llmfleet.planner",
    "llmfleet.engine",
    "llmfleet.standins",
    "llmfleet.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmfleet",
        description="Serve fine-tuned LLMs with vLLM on bare-metal GPU hosts.",
    )
    parser.add_argument("--version", action="version", version=f"llmfleet {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_GROUPS:
        importlib.import_module(module_name).register(subparsers)
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
