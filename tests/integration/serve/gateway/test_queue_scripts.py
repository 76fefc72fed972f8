"""The queue's Lua scripts against a real redis-server (no vLLM): limits, fencing, first-result-wins, dead letters.

These are the atomic steps the delivery guarantees rest on, each driven
directly as a gateway or a worker would, including the interleavings that
only happen when a worker is presumed dead but is not.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from llmfleet.serve.queue.config import QueueSettings, RedisSettings
from llmfleet.serve.queue.consumer import Consumer, Entry
from llmfleet.serve.queue.jobs import Job, Result, now_ms
from llmfleet.serve.queue.keys import GROUP
from llmfleet.serve.queue.producer import Limit, Producer
from tests.integration.serve.gateway.gatewaystack import RedisServer

# anyio's pytest plugin (installed with anyio) runs the async tests on asyncio.
pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[aioredis.Redis]:
    password = tmp_path / "password"
    password.write_text(redis_server.password)
    password.chmod(0o600)
    settings = RedisSettings(
        url=f"redis://127.0.0.1:{redis_server.port}/0", username="llmfleet", password_file=password
    )
    redis_client = settings.client()
    await redis_client.flushall()
    try:
        yield redis_client
    finally:
        await redis_client.aclose()


QUEUE = QueueSettings(max_depth=3, max_attempts=2, claim_idle_ms=200)


def job(request_id: str | None = None, *, stream: bool = False, reply: str = "llmfleet:reply:gw") -> Job:
    now = now_ms()
    return Job(
        id=request_id or secrets.token_hex(16),
        kind="completion",
        model="tiny",
        payload={"model": "tiny", "prompt": "hi", "max_tokens": 4},
        stream=stream,
        reply=reply,
        subject="alice",
        tenant="acme",
        lane="normal",
        prompt_tokens=1,
        max_tokens=4,
        enqueued_ms=now,
        deadline_ms=now + 60_000,
        queue_deadline_ms=now + 30_000,
    )


async def admit(producer: Producer, queued: Job, limits: tuple[Limit, ...] = (), cap: int = 0) -> Any:
    return await producer.admit(queued, mode="sync", limits=limits, concurrency_cap=cap, lease_ms=60_000)


async def test_admission_counts_requests_per_minute_and_refuses_with_retry_after(client: aioredis.Redis) -> None:
    producer = Producer(client, QueueSettings(max_depth=100), "gw")
    await producer.ensure_groups(["tiny"])
    limit = Limit("subject", "requests", producer.keys.rate("sub", "alice", "req"), limit=2, cost=1)
    outcomes = [await admit(producer, job(), (limit,)) for _ in range(3)]
    assert [o.outcome for o in outcomes] == ["admitted", "admitted", "rate_limited"]
    assert outcomes[1].limits[0].remaining == 1  # before counting this request; headers subtract it
    refused = outcomes[2]
    assert refused.refused_by == limit
    assert 1000 <= refused.retry_after_ms <= 120_000
    # A refused request leaves no trace: nothing queued, no job hash.
    assert await client.xlen(producer.keys.lane("normal", "tiny")) == 2


async def test_a_cost_above_the_limit_is_refused_for_good(client: aioredis.Redis) -> None:
    producer = Producer(client, QueueSettings(), "gw")
    await producer.ensure_groups(["tiny"])
    limit = Limit("tenant", "tokens", producer.keys.rate("tenant", "acme", "tok"), limit=100, cost=500)
    outcome = await admit(producer, job(), (limit,))
    assert outcome.outcome == "rate_limited" and outcome.refused_by == limit


async def test_the_concurrency_cap_and_the_depth_cap(client: aioredis.Redis) -> None:
    producer = Producer(client, QUEUE, "gw")
    await producer.ensure_groups(["tiny"])
    assert [(await admit(producer, job(), cap=2)).outcome for _ in range(3)] == ["admitted", "admitted", "rate_limited"]
    # Finishing one (what DELIVER does: ZREM) frees a slot.
    first = (await client.zrange(producer.keys.concurrency("alice"), 0, 0))[0]
    await client.zrem(producer.keys.concurrency("alice"), first)
    assert (await admit(producer, job(), cap=2)).outcome == "admitted"
    # Three entries in the stream: the depth cap (3) answers queue_full, before any limit is counted.
    assert (await admit(producer, job())).outcome == "queue_full"


async def test_admitting_the_same_request_twice_queues_it_once(client: aioredis.Redis) -> None:
    producer = Producer(client, QueueSettings(), "gw")
    await producer.ensure_groups(["tiny"])
    queued = job()
    assert (await admit(producer, queued)).outcome == "admitted"
    assert (await admit(producer, queued)).outcome == "admitted"
    assert await client.xlen(producer.keys.lane("normal", "tiny")) == 1


async def _take_one(consumer: Consumer) -> Entry:
    entries = await consumer.take(1)
    assert len(entries) == 1
    return entries[0]


async def test_the_first_result_wins_and_the_second_is_a_duplicate(client: aioredis.Redis) -> None:
    producer = Producer(client, QUEUE, "gw")
    await producer.ensure_groups(["tiny"])
    queued = job()
    await admit(producer, queued)
    worker_a = Consumer(client, client, QUEUE, "a")
    await worker_a.follow(["tiny"])
    worker_b = Consumer(client, client, QUEUE, "b")
    await worker_b.follow(["tiny"])
    entry = await _take_one(worker_a)
    assert (await worker_a.begin(queued.id)).attempt == 1
    await asyncio.sleep(QUEUE.claim_idle_ms / 1000 + 0.05)
    [reclaimed] = await worker_b.reclaim(1)  # a looks dead
    assert (await worker_b.begin(queued.id)).attempt == 2
    assert await worker_b.deliver(reclaimed, queued, 2, Result(200, {"text": "b"}), fenced=False) == 1
    assert await worker_a.deliver(entry, queued, 1, Result(200, {"text": "a"}), fenced=False) == 0
    stored = await producer.result(queued.id)
    assert stored is not None and stored.body == {"text": "b"}
    finals = [f for _, f in await client.xrange(queued.reply) if f["kind"] == "final"]
    assert len(finals) == 1
    assert await client.xlen(producer.keys.lane("normal", "tiny")) == 0  # acknowledged and deleted
    # A later delivery of the same entry finds it answered and only acknowledges it.
    assert (await worker_a.begin(queued.id)).outcome == "done"


async def test_a_stale_attempt_is_fenced_off_a_stream(client: aioredis.Redis) -> None:
    producer = Producer(client, QUEUE, "gw")
    await producer.ensure_groups(["tiny"])
    queued = job(stream=True)
    await admit(producer, queued)
    worker_a = Consumer(client, client, QUEUE, "a")
    await worker_a.follow(["tiny"])
    worker_b = Consumer(client, client, QUEUE, "b")
    await worker_b.follow(["tiny"])
    entry = await _take_one(worker_a)
    await worker_a.begin(queued.id)
    assert await worker_a.chunk(queued, 1, 1, "Hello", 1, ['{"n":1}']) == 1
    assert await worker_a.chunk(queued, 1, 1, "Hello", 1, ['{"n":1}']) == 0  # a retried call: applied once
    await asyncio.sleep(QUEUE.claim_idle_ms / 1000 + 0.05)
    [reclaimed] = await worker_b.reclaim(1)
    start = await worker_b.begin(queued.id)
    # The new attempt continues from what the client already has.
    assert (start.attempt, start.partial, start.partial_tokens) == (2, "Hello", 1)
    # The old attempt may neither add chunks nor answer, nor acknowledge the entry.
    assert await worker_a.chunk(queued, 1, 2, " world", 1, ['{"n":2}']) == -1
    assert await worker_a.deliver(entry, queued, 1, Result(200, {}), fenced=True) == -1
    assert await client.xlen(producer.keys.lane("normal", "tiny")) == 1
    assert await worker_b.chunk(queued, 2, 1, ", world", 1, ['{"n":2}']) == 2
    assert await worker_b.deliver(reclaimed, queued, 2, Result(200, {}), fenced=True) == 1
    chunks = [f for _, f in await client.xrange(queued.reply) if f["kind"] == "chunk"]
    assert [(c["seq"], c["text"]) for c in chunks] == [("1", "Hello"), ("2", ", world")]


async def test_after_max_attempts_the_entry_is_dead_lettered_with_the_reason(client: aioredis.Redis) -> None:
    producer = Producer(client, QUEUE, "gw")
    await producer.ensure_groups(["tiny"])
    queued = job()
    await admit(producer, queued)
    worker = Consumer(client, client, QUEUE, "w")
    await worker.follow(["tiny"])
    entry = await _take_one(worker)
    for attempt in (1, 2):
        assert (await worker.begin(queued.id)).attempt == attempt  # and then the worker "dies"
    start = await worker.begin(queued.id)
    assert start.outcome == "dead"
    assert "attempt 2 on w did not finish" in start.reason
    error = Result(502, {"error": {"message": "gave up"}})
    assert await worker.dead_letter(entry, queued, start.reason, 2, error) == 1
    [(_id, letter)] = await client.xrange(producer.keys.dead_letter)
    assert letter["id"] == queued.id and letter["attempts"] == "2" and "did not finish" in letter["reason"]
    assert json.loads(letter["job"])["id"] == queued.id
    stored = await producer.result(queued.id)
    assert stored is not None and stored.status == 502
    assert await client.xlen(producer.keys.lane("normal", "tiny")) == 0


async def test_touch_keeps_only_own_entries_alive_and_hand_back_frees_them_at_once(client: aioredis.Redis) -> None:
    producer = Producer(client, QUEUE, "gw")
    await producer.ensure_groups(["tiny"])
    await admit(producer, job())
    worker_a = Consumer(client, client, QUEUE, "a")
    await worker_a.follow(["tiny"])
    worker_b = Consumer(client, client, QUEUE, "b")
    await worker_b.follow(["tiny"])
    entry = await _take_one(worker_a)
    await asyncio.sleep(QUEUE.claim_idle_ms / 1000 + 0.05)
    assert await worker_a.touch([entry]) == 1  # idle reset: not reclaimable now
    assert await worker_b.reclaim(1) == []
    assert await worker_a.hand_back([entry]) == 1  # drain: reclaimable at once
    [taken] = await worker_b.reclaim(1)
    assert taken.entry_id == entry.entry_id
    assert await worker_a.touch([entry]) == 0  # no longer a's: a's heartbeat leaves it alone
    pending = await client.xpending_range(producer.keys.lane("normal", "tiny"), GROUP, "-", "+", 10)
    assert [p["consumer"] for p in pending] == ["b"]
