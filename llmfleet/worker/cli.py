"""`llmfleet worker run`: the worker process, configured by LLMFLEET_WORKER_* and friends."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when running, not for every `llmfleet` command
    from llmfleet.worker.config import WorkerSettings


def _run(settings: WorkerSettings) -> int:
    from llmfleet.worker.app import run

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per engine call otherwise
    return asyncio.run(run(settings))


def serve() -> int:
    """Load settings (env + secret files), then run until SIGTERM. Exit 2 on bad settings."""
    # Imported here: the queue needs redis, which other `llmfleet` commands must not.
    from llmfleet.queue.config import start_service
    from llmfleet.worker.config import WorkerSettings

    return start_service("llmfleet worker", WorkerSettings.from_env, _run)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("worker", help="run a queue worker (settings from LLMFLEET_WORKER_* etc.)")
    commands = parser.add_subparsers(dest="worker_command", required=True, metavar="COMMAND")
    run_parser = commands.add_parser("run", help="take requests from the queue and call the engines until SIGTERM")
    run_parser.set_defaults(handler=lambda _args: serve())
