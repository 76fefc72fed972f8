"""The gateway's and workers' Redis client parses replies with hiredis, the C parser (issue 30)."""

from __future__ import annotations

import asyncio

from redis._parsers import _AsyncHiredisParser

from llmfleet.serve.queue.config import RedisSettings


def test_the_services_redis_client_parses_with_hiredis() -> None:
    # redis-py picks hiredis only when it is importable and new enough (redis.utils.HIREDIS_AVAILABLE): a pin that
    # drifts out of its range would fall back, silently, to the Python parser. No connection is opened.
    async def parser() -> type:
        client = RedisSettings(url="redis://127.0.0.1:1/0").client(name="test")
        try:
            return type(client.connection_pool.make_connection()._parser)
        finally:
            await client.aclose()

    assert asyncio.run(parser()) is _AsyncHiredisParser
