"""The gateway's cached registry against a real redis-server: one read per max age, however many requests ask.

Requests read the registry (which models have a healthy engine) through CachedRegistry. When the snapshot is
stale, every request that arrives while the fresh read is under way waits for that read: a burst sends one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from llmfleet.serve.queue.config import RedisSettings
from llmfleet.serve.queue.keys import Keys
from llmfleet.serve.queue.registry import CachedRegistry, EngineReport, publish
from tests.integration.serve.gateway.gatewaystack import PREFIX, RedisServer

pytestmark = pytest.mark.anyio
KEYS = Keys(PREFIX)


@pytest.fixture
async def client(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[aioredis.Redis]:
    """A client as the gateway (the redis role's ACL user), on an emptied Redis with one worker's report."""
    with redis_server.client() as admin:
        admin.flushall()
    password = tmp_path / "password"
    password.write_text(redis_server.password)
    password.chmod(0o600)
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    worker = RedisSettings(url=url, username="worker", password_file=password).client()
    engine = EngineReport(url="http://10.0.0.1:8000", healthy=True, models={"tiny": 2048})
    await publish(worker, KEYS, "worker-1", [engine], ttl_s=60, draining=False)
    await worker.aclose()
    gateway = RedisSettings(url=url, username="gateway", password_file=password).client()
    try:
        yield gateway
    finally:
        await gateway.aclose()


def reads(redis_server: RedisServer) -> int:
    """How many times the registry was read: each read lists the workers (SMEMBERS) once."""
    with redis_server.client() as admin:
        stats: dict[str, Any] = admin.info("commandstats")
    return int(stats.get("cmdstat_smembers", {}).get("calls", 0))


async def test_a_burst_of_requests_on_a_stale_snapshot_reads_the_registry_once(
    client: aioredis.Redis, redis_server: RedisServer
) -> None:
    registry = CachedRegistry(client, KEYS, max_age_s=60)
    before = reads(redis_server)
    snapshots = await asyncio.gather(*(registry.snapshot() for _ in range(50)))
    assert reads(redis_server) - before == 1
    assert {snapshot.models["tiny"].healthy_engines for snapshot in snapshots} == {1}
    # Fresh now: no read at all.
    await asyncio.gather(*(registry.snapshot() for _ in range(50)))
    assert reads(redis_server) - before == 1
    # Stale again (max age 0): the next burst reads once more.
    registry.max_age_s = 0
    await asyncio.sleep(0.01)
    await asyncio.gather(*(registry.snapshot() for _ in range(50)))
    assert reads(redis_server) - before == 2


async def test_a_cancelled_request_leaves_the_read_to_the_others(client: aioredis.Redis) -> None:
    registry = CachedRegistry(client, KEYS, max_age_s=60)
    first = asyncio.create_task(registry.snapshot())
    second = asyncio.create_task(registry.snapshot())
    await asyncio.sleep(0)  # both waiting on the one read
    first.cancel()
    snapshot = await second
    assert snapshot.workers == 1 and first.cancelled()


async def test_a_failed_read_fails_its_waiters_and_the_next_request_reads_again(
    client: aioredis.Redis, redis_server: RedisServer
) -> None:
    registry = CachedRegistry(client, KEYS, max_age_s=60)
    with redis_server.client() as admin:
        admin.set(f"{KEYS.prefix}:workers", "not a set")  # SMEMBERS now fails with WRONGTYPE
    results = await asyncio.gather(registry.snapshot(), registry.snapshot(), return_exceptions=True)
    assert all(isinstance(result, aioredis.ResponseError) for result in results), results
    with redis_server.client() as admin:
        admin.delete(f"{KEYS.prefix}:workers")
        admin.sadd(f"{KEYS.prefix}:workers", "worker-1")
    assert (await registry.snapshot()).workers == 1
