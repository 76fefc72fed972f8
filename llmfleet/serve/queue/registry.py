"""The live-engine registry: workers report the engines they see, gateways read it.

Each worker writes `<prefix>:engines:<worker id>` (JSON, expiring after
engine_stale_s, refreshed every health round) and adds its id to
`<prefix>:workers`. A gateway reads every live report: a model is servable when
some live worker sees a healthy engine serving it. Expiry uses Redis's clock,
so host clocks need not agree; a worker that dies simply stops refreshing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from llmfleet.serve.queue.keys import Keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineReport:
    url: str
    healthy: bool
    # served model name -> max_model_len the engine reports (0 if unknown)
    models: dict[str, int] = field(default_factory=dict)
    outstanding: int = 0
    # Listed in the drained set: the worker sends it nothing new (healthy is then False).
    drained: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "models": self.models,
            "outstanding": self.outstanding,
            "drained": self.drained,
        }


def workers_key(keys: Keys) -> str:
    return f"{keys.prefix}:workers"


def report_key(keys: Keys, worker_id: str) -> str:
    return f"{keys.engines}:{worker_id}"


async def publish(
    client: aioredis.Redis, keys: Keys, worker_id: str, engines: list[EngineReport], *, ttl_s: float, draining: bool
) -> None:
    report = {"worker": worker_id, "draining": draining, "engines": [engine.to_dict() for engine in engines]}
    async with client.pipeline(transaction=False) as pipe:
        pipe.set(report_key(keys, worker_id), json.dumps(report), px=max(int(ttl_s * 1000), 100))
        pipe.sadd(workers_key(keys), worker_id)
        await pipe.execute()


async def withdraw(client: aioredis.Redis, keys: Keys, worker_id: str) -> None:
    async with client.pipeline(transaction=False) as pipe:
        pipe.delete(report_key(keys, worker_id))
        pipe.srem(workers_key(keys), worker_id)
        await pipe.execute()


@dataclass(frozen=True)
class LiveModel:
    name: str
    max_model_len: int
    healthy_engines: int


@dataclass(frozen=True)
class Snapshot:
    workers: int
    models: dict[str, LiveModel]

    @property
    def healthy_engines(self) -> int:
        return sum(model.healthy_engines for model in self.models.values())


async def live_reports(client: aioredis.Redis, keys: Keys) -> list[dict[str, Any]]:
    """The reports of every worker whose report has not expired (forgetting those that have)."""
    worker_ids = sorted(str(worker_id) for worker_id in await client.smembers(workers_key(keys)))
    if not worker_ids:
        return []
    reports = await client.mget([report_key(keys, worker_id) for worker_id in worker_ids])
    gone = [worker_id for worker_id, report in zip(worker_ids, reports, strict=True) if report is None]
    if gone:
        await client.srem(workers_key(keys), *gone)
    live = []
    for report in reports:
        if report is None:
            continue
        try:
            data = json.loads(report)
        except ValueError as error:
            log.warning("ignoring a malformed engine report: %s", error)
            continue
        if isinstance(data, dict):
            live.append(data)
    return live


async def read(client: aioredis.Redis, keys: Keys) -> Snapshot:
    """Every live worker's report merged: models served by at least one healthy engine."""
    engines: dict[str, tuple[bool, dict[str, int]]] = {}
    live_workers = 0
    for data in await live_reports(client, keys):
        try:
            if data.get("draining"):
                continue
            live_workers += 1
            for engine in data["engines"]:
                url = str(engine["url"])
                healthy = bool(engine["healthy"])
                served = {str(name): int(length) for name, length in dict(engine["models"]).items()}
                # Two workers may see the same engine: healthy if any sees it healthy.
                was_healthy, was_served = engines.get(url, (False, {}))
                engines[url] = (healthy or was_healthy, served or was_served)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring a malformed engine report: %s", error)
    models: dict[str, LiveModel] = {}
    for healthy, engine_models in engines.values():
        if not healthy:
            continue
        for name, length in engine_models.items():
            known = models.get(name)
            if known is None:
                models[name] = LiveModel(name, length, 1)
            else:
                # Engines of one model should agree; the smallest context is the safe one.
                lengths = [n for n in (known.max_model_len, length) if n > 0]
                models[name] = LiveModel(name, min(lengths) if lengths else 0, known.healthy_engines + 1)
    return Snapshot(live_workers, models)


class CachedRegistry:
    """The registry read at most once per max_age_s per process (request paths read it).

    Requests that find the snapshot stale while a read is under way wait for that read instead of
    starting their own: at saturation the gateway used to send one read per request that arrived
    during it (about 50 a second instead of 1, 7% of its CPU).
    """

    def __init__(self, client: aioredis.Redis, keys: Keys, *, max_age_s: float = 1.0) -> None:
        self.client = client
        self.keys = keys
        self.max_age_s = max_age_s
        self._snapshot: Snapshot | None = None
        self._read_at = 0.0
        self._reading: asyncio.Task[Snapshot] | None = None

    async def snapshot(self) -> Snapshot:
        if self._snapshot is not None and time.monotonic() - self._read_at <= self.max_age_s:
            return self._snapshot
        if self._reading is None:
            self._reading = asyncio.create_task(self._read())
            # Retrieved here too: a read whose every waiter was cancelled must not log "never retrieved".
            self._reading.add_done_callback(lambda task: task.cancelled() or task.exception())
        # Shielded: a waiter cancelled (its client went away) leaves the read to the others.
        return await asyncio.shield(self._reading)

    async def _read(self) -> Snapshot:
        started = time.monotonic()
        try:
            snapshot = await read(self.client, self.keys)
        finally:
            self._reading = None
        self._snapshot, self._read_at = snapshot, started
        return snapshot
