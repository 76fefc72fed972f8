"""ReplyListener after a Redis error: every waiter is told to check its stored result at once (producer.py).

Notifications written while the listener could not read may be gone (a Redis restart without persistence), and
waiters back off their own polls to tens of seconds (issue 34), so the listener is what makes them look now.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from llmfleet.serve.queue.producer import ReplyListener


class FlakyClient:
    """xread fails once, then blocks with nothing to read, as a Redis that came back does (a FAKE Redis client)."""

    def __init__(self) -> None:
        self.reads = 0
        self.read_after_error = asyncio.Event()

    async def xread(self, streams: dict[str, str], count: int, block: int) -> list[Any]:
        self.reads += 1
        if self.reads == 1:
            raise RedisConnectionError("Connection reset by peer")
        self.read_after_error.set()
        await asyncio.sleep(block / 1000)
        return []

    async def xinfo_stream(self, key: str) -> dict[str, Any]:
        return {"last-generated-id": "0-0"}


def test_waiters_are_told_to_check_once_the_listener_is_past_a_redis_error() -> None:
    async def scenario() -> tuple[bool, bool]:
        client = FlakyClient()
        listener = ReplyListener(client, "p:reply:gw", block_ms=50)  # type: ignore[arg-type]
        waiter = listener.register("a", expires_ms=2**62)
        quiet = not waiter.check_now.is_set()
        listener.start()
        try:
            await asyncio.wait_for(client.read_after_error.wait(), timeout=10)
        finally:
            await listener.stop()
        return quiet, waiter.check_now.is_set()

    quiet_before, told = asyncio.run(scenario())
    assert quiet_before, "no waiter is told to check before anything went wrong"
    assert told, "after the error the waiter must look at its stored result"
