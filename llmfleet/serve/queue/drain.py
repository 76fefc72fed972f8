"""Draining engines before they change: no new requests to them, and the running ones finished.

`llmfleet worker drain --engine URL ...` adds the URLs to the queue's drained set
(`<prefix>:drained`). Every worker reads the set each report round
(LLMFLEET_WORKER_HEALTH_INTERVAL_S), sends those engines nothing new, and says
so in its engine report, with the requests still running on each. A drain is
complete when every live worker that knows an engine reports it drained with
nothing running on it.

`llmfleet worker undrain` removes the URLs and waits until every live worker
that knows an engine sees it serving again, so a rolling change does not drain
the next host before this one serves. The engines playbook runs both around each host
(playbooks/tasks/engine_rotation.yml).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from llmfleet.serve.queue import registry
from llmfleet.serve.queue.keys import Keys

POLL_S = 0.5


class DrainError(Exception):
    """The drain or undrain cannot be done or did not finish in time; the message says why."""


@dataclass(frozen=True)
class EngineState:
    url: str
    workers: int  # live workers whose pool has the engine
    drained: int  # of those, how many send it nothing new
    running: int  # requests running on it, over all those workers
    healthy: int  # workers that would send it requests now

    def describe(self) -> str:
        return (
            f"{self.url}: {self.workers} workers know it, {self.drained} drained it,"
            f" {self.running} requests running, {self.healthy} see it serving"
        )


async def engine_states(client: aioredis.Redis, keys: Keys, urls: list[str]) -> dict[str, EngineState]:
    """What the live workers report about each engine."""
    counts = {url: [0, 0, 0, 0] for url in urls}
    for report in await registry.live_reports(client, keys):
        for engine in report.get("engines") or []:
            count = counts.get(str(engine.get("url")))
            if count is None:
                continue
            count[0] += 1
            count[1] += 1 if engine.get("drained") else 0
            count[2] += int(engine.get("outstanding") or 0)
            count[3] += 1 if engine.get("healthy") else 0
    return {url: EngineState(url, *count) for url, count in counts.items()}


def is_drained(state: EngineState) -> bool:
    return state.drained == state.workers and state.running == 0


def is_serving(state: EngineState) -> bool:
    # Every worker, not one: a worker still blind to it would find no engine once the next host drains.
    return state.workers > 0 and state.healthy == state.workers


async def _refuse_unknown(client: aioredis.Redis, keys: Keys, urls: list[str]) -> bool:
    """False when no worker is live (nothing to wait for); an error for URLs no live worker knows (a typo?)."""
    reports = await registry.live_reports(client, keys)
    if not reports:
        return False
    known = {str(engine.get("url")) for report in reports for engine in report.get("engines") or []}
    unknown = [url for url in urls if url not in known]
    if unknown:
        raise DrainError(
            f"no live worker sends requests to {', '.join(unknown)}; the workers know {', '.join(sorted(known))}"
        )
    return True


async def _wait(
    client: aioredis.Redis,
    keys: Keys,
    urls: list[str],
    done: Callable[[EngineState], bool],
    what: str,
    timeout_s: float,
) -> dict[str, EngineState]:
    deadline = time.monotonic() + timeout_s
    while True:
        states = await engine_states(client, keys, urls)
        if all(done(state) for state in states.values()):
            return states
        if time.monotonic() > deadline:
            lines = "\n".join(state.describe() for state in states.values())
            raise DrainError(f"{what} not done after {timeout_s:.0f} s:\n{lines}")
        await asyncio.sleep(POLL_S)


async def drain(client: aioredis.Redis, keys: Keys, urls: list[str], timeout_s: float | None) -> dict[str, EngineState]:
    """Send the engines nothing new; wait (unless timeout_s is None) until no live worker runs anything on them."""
    workers_live = await _refuse_unknown(client, keys, urls)
    await client.sadd(keys.drained, *urls)
    if not workers_live or timeout_s is None:
        return {}
    return await _wait(client, keys, urls, is_drained, "the drain", timeout_s)


async def undrain(
    client: aioredis.Redis, keys: Keys, urls: list[str], timeout_s: float | None
) -> dict[str, EngineState]:
    """Send the engines work again; wait (unless timeout_s is None) until every live worker sees them serving."""
    workers_live = await _refuse_unknown(client, keys, urls)
    await client.srem(keys.drained, *urls)
    if not workers_live or timeout_s is None:
        return {}
    return await _wait(client, keys, urls, is_serving, "the undrain", timeout_s)
