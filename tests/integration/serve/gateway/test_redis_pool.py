"""A gateway whose Redis pool is used up says so (503 gateway_busy), not that Redis is down (real redis-server).

The gateway's Redis client waits up to LLMFLEET_REDIS_SOCKET_TIMEOUT_S for a free
connection of its pool (RedisSettings.client); past it, redis-py raises a
ConnectionError that is not Redis's. errors.queue_error tells the two apart from
what redis-py raises, so the test raises both for real: a pool whose every
connection is held by a blocking read, and a port where nothing listens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from llmfleet.bench.peers import free_loopback_port
from llmfleet.serve.gateway.errors import pool_exhausted, queue_error
from llmfleet.serve.queue.config import RedisSettings
from tests.integration.serve.gateway.gatewaystack import RedisServer

pytestmark = pytest.mark.anyio

POOL = 4  # the smallest pool RedisSettings accepts
HELD = "llmfleet-test:held"  # the list the pool's connections block on


def _settings(port: int, tmp_path: Path, password: str) -> RedisSettings:
    password_file = tmp_path / "password"
    password_file.write_text(password)
    password_file.chmod(0o600)
    return RedisSettings(
        url=f"redis://127.0.0.1:{port}/0",
        username="llmfleet",
        password_file=password_file,
        socket_timeout_s=0.3,
        connect_timeout_s=0.3,
        max_connections=POOL,
    )


async def _until_blocked(redis_server: RedisServer, clients: int) -> None:
    """Until Redis reports that many clients in a blocking read: each holder has its connection."""
    with redis_server.client() as admin:
        for _ in range(1000):
            if int(admin.info("clients")["blocked_clients"]) >= clients:
                return
            await asyncio.sleep(0.005)
    pytest.fail(f"Redis never saw {clients} blocked clients")


async def test_a_pool_with_every_connection_busy_is_gateway_busy(redis_server: RedisServer, tmp_path: Path) -> None:
    # blocking_s: the socket waits out the blocking reads; the pool's wait for a free connection stays 0.3 s.
    client = _settings(redis_server.port, tmp_path, redis_server.password).client(blocking_s=30)
    try:
        holders = [asyncio.create_task(client.blpop([HELD], timeout=30)) for _ in range(POOL)]
        await _until_blocked(redis_server, POOL)
        with pytest.raises(RedisConnectionError) as raised:
            await client.ping()
        assert pool_exhausted(raised.value)
        error = queue_error(raised.value)
        assert (error.status, error.code, error.headers) == (503, "gateway_busy", {"Retry-After": "1"})
        # Redis itself answered all along: the holders get what is pushed, and the pool serves again.
        with redis_server.client() as admin:
            admin.lpush(HELD, *range(POOL))
        assert sorted(value for _, value in await asyncio.gather(*holders)) == [str(n) for n in range(POOL)]
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_a_redis_that_does_not_answer_is_queue_unavailable(tmp_path: Path) -> None:
    client = _settings(free_loopback_port(), tmp_path, "unused").client()
    try:
        with pytest.raises(RedisConnectionError) as raised:
            await client.ping()
        assert not pool_exhausted(raised.value)
        assert (queue_error(raised.value).status, queue_error(raised.value).code) == (503, "queue_unavailable")
    finally:
        await client.aclose()
