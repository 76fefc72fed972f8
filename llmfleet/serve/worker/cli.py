"""`llmfleet worker run|drain|undrain`: the worker process, and taking engines out of its rotation.

`run` is configured by LLMFLEET_WORKER_* and friends; `drain` and `undrain`
need only LLMFLEET_REDIS_* and LLMFLEET_QUEUE_PREFIX, so they run inside a
worker container (`docker exec llmfleet-worker-1 llmfleet worker drain ...`)
with its credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when running, not for every `llmfleet` command
    from llmfleet.serve.queue.config import QueueSettings, RedisSettings
    from llmfleet.serve.worker.config import WorkerSettings


def _run(settings: WorkerSettings) -> int:
    import uvloop

    from llmfleet.serve.worker.app import run

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per engine call otherwise
    # uvloop, as the gateway's uvicorn uses: its socket I/O and callbacks cost
    # less CPU than asyncio's own loop, and the worker is all socket I/O.
    return uvloop.run(run(settings))


def serve() -> int:
    """Load settings (env + secret files), then run until SIGTERM. Exit 2 on bad settings."""
    # Imported here: the queue needs redis, which other `llmfleet` commands must not.
    from llmfleet.serve.queue.config import start_service
    from llmfleet.serve.worker.config import WorkerSettings

    return start_service("llmfleet worker", WorkerSettings.from_env, _run)


async def _change_rotation(
    settings: tuple[RedisSettings, QueueSettings], urls: list[str], *, drain: bool, timeout_s: float | None
) -> int:
    from redis.exceptions import RedisError

    from llmfleet.serve.queue import drain as rotation
    from llmfleet.serve.queue.keys import Keys

    redis_settings, queue_settings = settings
    client = redis_settings.client(name="llmfleet-drain")
    try:
        change = rotation.drain if drain else rotation.undrain
        states = await change(client, Keys(queue_settings.prefix), urls, timeout_s)
    except rotation.DrainError as error:
        print(f"llmfleet worker {'drain' if drain else 'undrain'}: {error}", file=sys.stderr)
        return 1
    except RedisError as error:
        print(
            f"llmfleet worker {'drain' if drain else 'undrain'}: Redis at {redis_settings.url}: {error}",
            file=sys.stderr,
        )
        return 1
    finally:
        await client.aclose()
    if timeout_s is None:
        print(f"{'drained' if drain else 'undrained'} {', '.join(urls)}; not waiting for the workers")
    elif not states:
        print("no worker is running: nothing to wait for")
    for state in states.values():
        print(state.describe())
    return 0


def rotation_command(args: argparse.Namespace) -> int:
    """Drain or undrain the engines named by --engine; exit 2 on bad settings, 1 when it cannot finish."""
    from llmfleet.serve.queue.config import QueueSettings, RedisSettings, start_service

    timeout_s = None if args.no_wait else args.timeout
    return start_service(
        f"llmfleet worker {args.worker_command}",
        lambda: (RedisSettings(), QueueSettings()),
        lambda settings: asyncio.run(
            _change_rotation(settings, args.engine, drain=args.worker_command == "drain", timeout_s=timeout_s)
        ),
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("worker", help="run a queue worker (settings from LLMFLEET_WORKER_* etc.)")
    commands = parser.add_subparsers(dest="worker_command", required=True, metavar="COMMAND")
    run_parser = commands.add_parser("run", help="take requests from the queue and call the engines until SIGTERM")
    run_parser.set_defaults(handler=lambda _args: serve())
    helps = {
        "drain": "send engines no new requests and wait until the requests running on them finish",
        "undrain": "send engines requests again and wait until every worker sees them serving",
    }
    for name, text in helps.items():
        parser_ = commands.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}.")
        parser_.add_argument(
            "--engine", action="append", required=True, metavar="URL", help="engine root as the workers know it"
        )
        parser_.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")
        parser_.add_argument("--no-wait", action="store_true", help="change the drained set and return at once")
        parser_.set_defaults(handler=rotation_command)
