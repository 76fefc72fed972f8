"""`llmfleet scaler serve|status|audit`: the webhook service, and what it has done.

`serve` is configured by LLMFLEET_SCALER_* (see config.py); the roles/scaler
systemd unit sets them from an environment file. `status` and `audit` read the
state directory only (the state file is replaced atomically, so reading it
while the service runs is safe) and print JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when serving, not for every `llmfleet` command
    from fastapi import FastAPI

    from llmfleet.serve.scaler.config import ScalerSettings

DEFAULT_STATE_DIR = Path("/var/lib/llmfleet-scaler")


def _load() -> tuple[ScalerSettings, FastAPI]:
    from llmfleet.serve.scaler.app import create_app
    from llmfleet.serve.scaler.config import ScalerSettings

    settings = ScalerSettings.from_env()
    return settings, create_app(settings)


def _serve(loaded: tuple[ScalerSettings, FastAPI]) -> int:
    import uvicorn

    from llmfleet.serve.queue.config import log_level

    settings, app = loaded
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level().lower(), server_header=False)
    return 0


def serve() -> int:
    from llmfleet.serve.queue.config import start_service

    return start_service("llmfleet scaler", _load, _serve)


def status(args: argparse.Namespace) -> int:
    from llmfleet.serve.scaler.state import load

    state = load(args.state_dir / "state.json")
    print(json.dumps(state.model_dump(mode="json"), indent=2))
    return 0


def audit(args: argparse.Namespace) -> int:
    from llmfleet.serve.scaler.audit import read

    for record in read(args.state_dir / "audit.jsonl")[-args.tail :]:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("scaler", help="alert-driven scale-out and scale-in (Alertmanager webhook)")
    commands = parser.add_subparsers(dest="scaler_command", required=True, metavar="COMMAND")
    serve_parser = commands.add_parser("serve", help="serve POST /alerts until SIGTERM (settings: LLMFLEET_SCALER_*)")
    serve_parser.set_defaults(handler=lambda _args: serve())
    for name, handler, text in (
        ("status", status, "print the state: membership, cooldowns, the action in flight"),
        ("audit", audit, "print the last audit records, one JSON object a line"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help=f"default {DEFAULT_STATE_DIR}")
        if name == "audit":
            sub.add_argument("--tail", type=int, default=20, help="how many records (default 20)")
        sub.set_defaults(handler=handler)
