"""`llmfleet bench --redis-url URL`: the Redis commands each answer cost, from INFO commandstats.

Redis counts every command it runs, and how long it ran, by name. Read at the
window's start and end, the difference divided by the window's answers is what
one answer cost Redis: per command, calls and microseconds. Commands a script
runs count under their own names too, so a Lua step shows as one EVALSHA (a
round trip from a client) plus the commands inside it; the EVALSHA's time
includes theirs. Commands of anything else using that Redis meanwhile (the
workers' metrics, a health check) are in the figures: on the lab they are a
small share at saturation.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

from llmfleet.errors import LlmfleetError

# Client-side round trips: the commands a client sends itself. Scripts' inner commands never appear as these.
SCRIPT_CALLS = ("evalsha", "eval", "fcall")
INFO_TIMEOUT_S = 10.0
# command -> (calls, usec) as INFO commandstats gives them.
Reading = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class CommandCost:
    calls: float  # per answered request
    usec: float  # per answered request, inside Redis


def read(url: str, password: str) -> Reading:
    """command -> (calls, usec) since Redis started (or CONFIG RESETSTAT)."""
    import redis  # a service library: the CLI loads without it (tests/unit/test_cli_imports.py)

    try:
        with redis.Redis.from_url(url, password=password or None, socket_timeout=INFO_TIMEOUT_S) as client:
            info: dict[str, Any] = client.info("commandstats")
    except redis.RedisError as error:
        raise LlmfleetError(f"--redis-url {url}: cannot read INFO commandstats: {error}") from None
    return {
        name.removeprefix("cmdstat_"): (int(stats["calls"]), int(stats["usec"]))
        for name, stats in info.items()
        if name.startswith("cmdstat_")
    }


def per_request(before: Reading, after: Reading, answers: int) -> dict[str, CommandCost]:
    """Each command's calls and microseconds per answer between two readings, most calls first."""
    costs = {}
    for name, (calls, usec) in after.items():
        earlier_calls, earlier_usec = before.get(name, (0, 0))
        if calls > earlier_calls:
            costs[name] = CommandCost(
                round((calls - earlier_calls) / max(answers, 1), 2), round((usec - earlier_usec) / max(answers, 1), 1)
            )
    return dict(sorted(costs.items(), key=lambda item: -item[1].calls))


async def window(url: str, password: str, window_start: float, window_end: float) -> tuple[Reading, Reading]:
    """The readings at the window's start and end (time.perf_counter), each in a thread: the load goes on."""
    await asyncio.sleep(max(window_start - time.perf_counter(), 0.0))
    before = await asyncio.to_thread(read, url, password)
    await asyncio.sleep(max(window_end - time.perf_counter(), 0.0))
    return before, await asyncio.to_thread(read, url, password)


def as_json(costs: dict[str, CommandCost]) -> dict[str, dict[str, float]]:
    return {name: asdict(cost) for name, cost in costs.items()}


def describe(costs: dict[str, dict[str, float]]) -> str:
    """One line of as_json's figures: all commands and the script calls per answer, and the most called."""
    total = sum(cost["calls"] for cost in costs.values())
    scripts = sum(cost["calls"] for name, cost in costs.items() if name in SCRIPT_CALLS)
    busiest = ", ".join(f"{name} {cost['calls']:g}" for name, cost in list(costs.items())[:8])
    return f"Redis commands per answer: {total:.1f} ({scripts:.1f} script calls); {busiest}"
