"""`llmfleet gateway serve`: one gateway process under uvicorn, configured by LLMFLEET_GATEWAY_* and friends.

One process per container (or per `llmfleet gateway serve`): scale with more
processes behind the load balancer. Each process has its own reply stream
and its own metrics; the rate limits and the queue are shared through Redis.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when serving, not for every `llmfleet` command
    from fastapi import FastAPI

    from llmfleet.serve.gateway.config import GatewaySettings


def _load() -> tuple[GatewaySettings, FastAPI]:
    from llmfleet.serve.gateway.app import create_app
    from llmfleet.serve.gateway.config import GatewaySettings

    settings = GatewaySettings.from_env()
    return settings, create_app(settings)  # secret files and tokenizers are checked here, before a port is bound


def _serve(loaded: tuple[GatewaySettings, FastAPI]) -> int:
    import uvicorn

    from llmfleet.serve.queue.config import log_level

    settings, app = loaded
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # uvloop and httptools when installed (they are pinned): the asyncio and h11 fallbacks are slower.
        loop="auto",
        http="auto",
        log_level=log_level().lower(),
        access_log=os.environ.get("LLMFLEET_GATEWAY_ACCESS_LOG", "0") == "1",
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        server_header=False,
    )
    # One server on both listeners: one lifespan, one graceful shutdown; the
    # routes tell the listeners apart by the local port (deps.only_on_listener).
    sockets = [config.bind_socket()]
    if settings.ops_port is not None:
        # log_config None: the first Config has set up logging already.
        sockets.append(uvicorn.Config(app, host=settings.host, port=settings.ops_port, log_config=None).bind_socket())
    server = uvicorn.Server(config)
    server.run(sockets=sockets)
    return 0 if server.started else 3  # 3: uvicorn's own code for a start-up failure


def serve() -> int:
    """Load settings (env + secret files), build the app, serve until SIGTERM. Exit 2 on bad settings."""
    # Imported here: the queue needs redis, which other `llmfleet` commands must not.
    from llmfleet.serve.queue.config import start_service

    return start_service("llmfleet gateway", _load, _serve)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "gateway", help="run the OpenAI-compatible gateway (settings from LLMFLEET_GATEWAY_*)"
    )
    commands = parser.add_subparsers(dest="gateway_command", required=True, metavar="COMMAND")
    serve_parser = commands.add_parser("serve", help="serve the API until SIGTERM (see docs/gateway.md for settings)")
    serve_parser.set_defaults(handler=lambda _args: serve())
