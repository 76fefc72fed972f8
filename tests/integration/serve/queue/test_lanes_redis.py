"""Priority lanes against a real redis-server (no vLLM): the ADMIT and TAKE scripts apply lanes.py's policy.

The gateway's side connects as the `gateway` ACL user and the worker's as
`worker`, with exactly the rights the redis role grants them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from llmfleet.serve.queue.config import QueueSettings, RedisSettings
from llmfleet.serve.queue.consumer import Consumer, Entry
from llmfleet.serve.queue.jobs import Job, now_ms
from llmfleet.serve.queue.producer import Admission, Producer
from tests.integration.serve.gateway.gatewaystack import PREFIX, RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def clients(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[dict[str, aioredis.Redis]]:
    """Clients as the gateway and the worker (the redis role's ACL users), on an emptied Redis."""
    with redis_server.client() as admin:
        admin.flushall()
    password = tmp_path / "password"
    password.write_text(redis_server.password)
    password.chmod(0o600)
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    made = {
        user: RedisSettings(url=url, username=user, password_file=password).client() for user in ("gateway", "worker")
    }
    try:
        yield made
    finally:
        for client in made.values():
            await client.aclose()


def job(lane: str, model: str = "tiny") -> Job:
    now = now_ms()
    return Job(
        id=secrets.token_hex(16),
        kind="completion",
        model=model,
        payload={"model": model, "prompt": "hi", "max_tokens": 4},
        stream=False,
        reply=f"{PREFIX}:reply:gw",
        subject=f"user-{lane}",
        tenant="acme",
        lane=lane,
        prompt_tokens=1,
        max_tokens=4,
        enqueued_ms=now,
        deadline_ms=now + 60_000,
        queue_deadline_ms=now + 30_000,
    )


async def admit(producer: Producer, lane: str, model: str = "tiny") -> Admission:
    return await producer.admit(job(lane, model), mode="sync", limits=(), concurrency_cap=0, lease_ms=60_000)


async def started(
    settings: QueueSettings, clients: dict[str, aioredis.Redis], models: tuple[str, ...] = ("tiny",)
) -> tuple[Producer, Consumer]:
    producer = Producer(clients["gateway"], settings, "gw")
    await producer.ensure_groups(["tiny", "other"])
    consumer = Consumer(clients["worker"], clients["worker"], settings, "worker-1")
    await consumer.follow(models)
    return producer, consumer


async def test_a_full_low_lane_does_not_refuse_a_high_request(clients: dict[str, aioredis.Redis]) -> None:
    settings = QueueSettings(prefix=PREFIX, max_depth=10, lane_reserve=0.2)  # caps: high 10, normal 8, low 6
    producer, consumer = await started(settings, clients)
    low = [(await admit(producer, "low")).outcome for _ in range(8)]
    assert low == ["admitted"] * 6 + ["queue_full"] * 2
    # Taken but not answered still counts: the depth is what is queued or running.
    assert len(await consumer.take(2)) == 2
    assert (await admit(producer, "low")).outcome == "queue_full"
    assert [(await admit(producer, "normal")).outcome for _ in range(3)] == ["admitted", "admitted", "queue_full"]
    high = [await admit(producer, "high") for _ in range(3)]
    assert [a.outcome for a in high] == ["admitted", "admitted", "queue_full"]
    assert high[1].depth == 10 and high[2].depth == 10
    assert await producer.depth("tiny") == {"high": 2, "normal": 2, "low": 6}


async def test_under_a_continuous_high_backlog_a_low_job_is_taken_within_the_bound(
    clients: dict[str, aioredis.Redis],
) -> None:
    settings = QueueSettings(prefix=PREFIX, lower_lane_every=5)
    producer, consumer = await started(settings, clients)
    for _ in range(3):
        assert (await admit(producer, "high")).outcome == "admitted"
    assert (await admit(producer, "low")).outcome == "admitted"
    lanes: list[str] = []
    for _ in range(30):
        assert (await admit(producer, "high")).outcome == "admitted"  # the high lane never runs dry
        entries = await consumer.take(1)
        assert len(entries) == 1
        lanes.append(entries[0].lane)
        await consumer.ack(entries[0])
    # Turn 1 (entry 5) tries normal, then low: the low job goes then, and high takes every other entry.
    assert lanes[:5] == ["high"] * 4 + ["low"]
    assert set(lanes[5:]) == {"high"}
    assert await producer.depth("tiny") == {"high": 4, "normal": 0, "low": 0}


async def test_one_take_of_many_mixes_in_the_fair_turns(
    clients: dict[str, aioredis.Redis], redis_server: RedisServer
) -> None:
    settings = QueueSettings(prefix=PREFIX, lower_lane_every=4)
    producer, consumer = await started(settings, clients)
    for lane, count in (("high", 20), ("normal", 3), ("low", 3)):
        for _ in range(count):
            assert (await admit(producer, lane)).outcome == "admitted"
    entries: list[Entry] = await consumer.take(12)
    # Entries 4, 8 and 12 are fair turns: normal, low, normal; the other nine come from high.
    by_lane: dict[str, Any] = {lane: sum(1 for e in entries if e.lane == lane) for lane in settings.lanes}
    assert by_lane == {"high": 9, "normal": 2, "low": 1}
    assert consumer.taken == 12
    # Oldest first within a lane: the first high entry queued is among those taken.
    with redis_server.client() as admin:
        first_high = admin.xrange(consumer.keys.lane("high", "tiny"), count=1)[0][0]
    assert first_high in {e.entry_id for e in entries}


def xreadgroup_calls(redis_server: RedisServer) -> int:
    with redis_server.client() as admin:
        stats: dict[str, Any] = admin.info("commandstats")
    return int(stats.get("cmdstat_xreadgroup", {}).get("calls", 0))


async def test_a_take_reads_each_stream_at_most_once_when_it_runs_dry(
    clients: dict[str, aioredis.Redis], redis_server: RedisServer
) -> None:
    # A worker with many free slots asks for many entries: with every lane empty, the fair turns used to read
    # the lower lanes again on every turn (2 reads a turn, a turn every 4 entries: 33 reads for 64 slots).
    settings = QueueSettings(prefix=PREFIX, lower_lane_every=4)
    producer, consumer = await started(settings, clients, models=("tiny", "other"))
    streams = len(settings.lanes) * 2
    before = xreadgroup_calls(redis_server)
    assert await consumer.take(64) == []
    assert xreadgroup_calls(redis_server) - before == streams
    # Two high and one low entry of one model, 64 asked: all three, the low one by the first fair turn. Each
    # stream is read until it gives fewer entries than asked, then never again: once each, and once more for
    # the low stream, whose first read gave the one entry its turn asked for (it could have held more).
    for lane in ("high", "high", "low"):
        assert (await admit(producer, lane)).outcome == "admitted"
    before = xreadgroup_calls(redis_server)
    taken = await consumer.take(64)
    assert sorted(entry.lane for entry in taken) == ["high", "high", "low"]
    assert xreadgroup_calls(redis_server) - before == streams + 1


async def test_a_worker_takes_only_the_models_it_follows(clients: dict[str, aioredis.Redis]) -> None:
    settings = QueueSettings(prefix=PREFIX)
    producer, tiny_worker = await started(settings, clients)
    for model in ("other", "tiny", "other", "tiny"):
        assert (await admit(producer, "normal", model)).outcome == "admitted"
    taken = await tiny_worker.take(10)
    assert [(entry.model, entry.lane) for entry in taken] == [("tiny", "normal")] * 2
    # The other model's jobs stay queued, untouched, for a worker that serves it.
    assert await tiny_worker.take(10) == [] and await tiny_worker.wait_take(10, 50) == []
    other_worker = Consumer(clients["worker"], clients["worker"], settings, "worker-2")
    await other_worker.follow(["other"])
    assert [entry.model for entry in await other_worker.take(10)] == ["other", "other"]
    for entry in taken:
        await tiny_worker.ack(entry)
    assert await producer.depth("tiny") == {"high": 0, "normal": 0, "low": 0}
    assert await producer.depth("other") == {"high": 0, "normal": 2, "low": 0}  # taken, not yet answered


async def test_one_models_backlog_does_not_refuse_another_model(clients: dict[str, aioredis.Redis]) -> None:
    producer, _ = await started(QueueSettings(prefix=PREFIX, max_depth=3), clients)
    assert [(await admit(producer, "high")).outcome for _ in range(4)] == ["admitted"] * 3 + ["queue_full"]
    assert (await admit(producer, "high", "other")).outcome == "admitted"


async def test_a_worker_following_two_models_takes_from_each_in_turn(clients: dict[str, aioredis.Redis]) -> None:
    producer, consumer = await started(QueueSettings(prefix=PREFIX), clients, models=("tiny", "other"))
    for _ in range(4):
        for model in ("tiny", "other"):
            assert (await admit(producer, "normal", model)).outcome == "admitted"
    # One entry a take: each take starts at the next model's stream, so neither backlog hogs the slots.
    models = [(await consumer.take(1))[0].model for _ in range(4)]
    assert sorted(models[:2]) == ["other", "tiny"] and sorted(models[2:]) == ["other", "tiny"]


async def test_only_a_worker_that_serves_the_model_reclaims_its_stalled_entry(
    clients: dict[str, aioredis.Redis],
) -> None:
    settings = QueueSettings(prefix=PREFIX, claim_idle_ms=200)
    producer, tiny_worker = await started(settings, clients)
    assert (await admit(producer, "normal", "other")).outcome == "admitted"
    gone = Consumer(clients["worker"], clients["worker"], settings, "worker-gone")
    await gone.follow(["other"])
    [stalled] = await gone.take(1)  # and then its worker dies
    stream = gone.keys.lane("normal", "other")
    deadline = time.monotonic() + 10
    while not await clients["worker"].xpending_range(stream, "workers", "-", "+", 1, idle=200):
        assert time.monotonic() < deadline, "the entry never went idle"
        await asyncio.sleep(0.05)
    assert await tiny_worker.reclaim(10) == []
    heir = Consumer(clients["worker"], clients["worker"], settings, "worker-3")
    await heir.follow(["other"])
    [reclaimed] = await heir.reclaim(10)
    assert (reclaimed.entry_id, reclaimed.model, reclaimed.reclaimed) == (stalled.entry_id, "other", True)


async def test_entries_an_older_gateway_queued_on_the_shared_lanes_are_still_taken(
    clients: dict[str, aioredis.Redis], redis_server: RedisServer
) -> None:
    settings = QueueSettings(prefix=PREFIX)
    _, consumer = await started(settings, clients)
    assert not await consumer.check_legacy()
    # As the gateway before per-model lanes queued: one shared stream per lane, with the group.
    legacy = f"{PREFIX}:q:normal"
    with redis_server.client() as admin:
        admin.xgroup_create(legacy, "workers", id="0", mkstream=True)
        entry_id = admin.xadd(legacy, {"id": "a" * 32, "job": job("normal").to_json()})
    assert await consumer.check_legacy()
    [entry] = await consumer.take(5)
    assert (entry.entry_id, entry.model, entry.lane) == (entry_id, "", "normal")
    await consumer.ack(entry)
    backlog = await consumer.backlog()
    assert [(backlog[stream].length, backlog[stream].pending) for stream in [("normal", ""), ("normal", "tiny")]] == [
        (0, 0), (0, 0)]


async def test_the_backlog_tells_waiting_from_in_flight_and_ages_the_oldest_waiting(
    clients: dict[str, aioredis.Redis],
) -> None:
    """What the worker exports for the alerts (Consumer.backlog), with the worker's own ACL rights."""
    settings = QueueSettings(prefix=PREFIX)
    producer, consumer = await started(settings, clients)
    quiet = (await consumer.backlog())[("normal", "tiny")]
    assert (quiet.length, quiet.pending, quiet.waiting, quiet.oldest_wait_s) == (0, 0, 0, 0.0)
    for _ in range(3):
        assert (await admit(producer, "normal")).outcome == "admitted"
    await asyncio.sleep(0.3)
    assert len(await consumer.take(1)) == 1  # the oldest: one in flight, two waiting
    await asyncio.sleep(0.2)
    backlog = (await consumer.backlog())[("normal", "tiny")]
    assert (backlog.length, backlog.pending, backlog.waiting) == (3, 1, 2)
    # The second entry is the oldest waiting one: admitted about 0.5 s ago, by Redis's clock.
    assert 0.4 <= backlog.oldest_wait_s < 5, backlog
    # All taken: nothing waits, whatever is in flight; the age is 0 again, not the in-flight one's.
    assert len(await consumer.take(5)) == 2
    backlog = (await consumer.backlog())[("normal", "tiny")]
    assert (backlog.length, backlog.pending, backlog.waiting, backlog.oldest_wait_s) == (3, 3, 0, 0.0)
