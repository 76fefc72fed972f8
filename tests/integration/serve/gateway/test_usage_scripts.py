"""Usage records and token budgets in the ADMIT and DELIVER scripts, against a real redis-server (no vLLM).

The gateway's side connects as the redis role's gateway user and the worker's
as its worker user (tests/integration/serve/conftest.py), so a key or command
the scripts need and the role does not grant fails here.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from llmfleet.ops.usage import read_report
from llmfleet.serve.queue.config import QueueSettings, RedisSettings
from llmfleet.serve.queue.consumer import Consumer, Entry
from llmfleet.serve.queue.jobs import Job, Result, error_body, now_ms
from llmfleet.serve.queue.producer import Admission, Producer
from llmfleet.serve.queue.usage import spend_keys, utc_day
from tests.integration.serve.gateway.gatewaystack import PREFIX, RedisServer

pytestmark = pytest.mark.anyio

QUEUE = QueueSettings(prefix=PREFIX, max_depth=1000, usage_retention_days=400)


async def _client(redis_server: RedisServer, tmp_path: Path, user: str) -> aioredis.Redis:
    password = tmp_path / f"{user}.password"
    password.write_text(redis_server.password)
    password.chmod(0o600)
    settings = RedisSettings(url=f"redis://127.0.0.1:{redis_server.port}/0", username=user, password_file=password)
    return settings.client()


@pytest.fixture
async def clients(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[dict[str, aioredis.Redis]]:
    made = {user: await _client(redis_server, tmp_path, user) for user in ("llmfleet", "gateway", "worker")}
    await made["llmfleet"].flushall()
    try:
        yield made
    finally:
        for client in made.values():
            await client.aclose()


def job(subject: str, *, prompt_tokens: int = 10, max_tokens: int = 30, model: str = "tiny") -> Job:
    now = now_ms()
    return Job(
        id=secrets.token_hex(16),
        kind="completion",
        model=model,
        payload={"model": model, "prompt": "hi", "max_tokens": max_tokens},
        stream=False,
        reply=f"{PREFIX}:reply:gw",
        subject=subject,
        tenant=subject,
        lane="normal",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        enqueued_ms=now,
        deadline_ms=now + 60_000,
        queue_deadline_ms=now + 30_000,
    )


async def admit(producer: Producer, queued: Job, tier: str = "default") -> Admission:
    cost = queued.prompt_tokens + queued.max_tokens
    return await producer.admit(
        queued, mode="sync", limits=(), concurrency_cap=0, lease_ms=60_000, tier=tier, cost=cost
    )


def answer(prompt: int, completion: int) -> Result:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return Result(200, {"object": "text_completion", "choices": [{"text": "x"}], "usage": usage})


async def taken(consumer: Consumer) -> dict[str, Entry]:
    """Every entry queued so far, by request id, as a worker takes them."""
    await consumer.follow(["tiny", "big"])
    return {entry.request_id: entry for entry in await consumer.take(100)}


async def run_and_deliver(consumer: Consumer, entry: Entry, queued: Job, result: Result) -> int:
    start = await consumer.begin(queued.id)
    assert start.outcome == "run"
    return await consumer.deliver(entry, queued, start.attempt, result, fenced=False)


async def spend(client: aioredis.Redis, queued: Job) -> list[dict[str, Any]]:
    keys = spend_keys(Producer(client, QUEUE, "x").keys, queued.subject, queued.enqueued_ms)
    return [await client.hgetall(key) for key in keys]


async def test_the_first_result_records_usage_once(clients: dict[str, aioredis.Redis]) -> None:
    producer = Producer(clients["gateway"], QUEUE, "gw")
    consumer = Consumer(clients["worker"], clients["worker"], QUEUE, "worker-1")
    await producer.ensure_groups(["tiny", "big"])
    first, second, failed = job("alice"), job("alice"), job("alice", model="big")
    for queued in (first, second, failed):
        assert (await admit(producer, queued)).outcome == "admitted"
    entries = await taken(consumer)
    assert await run_and_deliver(consumer, entries[first.id], first, answer(10, 25)) == 1
    assert await run_and_deliver(consumer, entries[second.id], second, answer(12, 3)) == 1
    died = Result(502, error_body("engine died", "engine_error"))
    assert await run_and_deliver(consumer, entries[failed.id], failed, died) == 1
    # A late duplicate of the first (another attempt's answer) is discarded, and records nothing.
    entry = Entry("normal", "0-1", {"id": first.id}, model="tiny")
    assert await consumer.deliver(entry, first, 2, answer(10, 99), fenced=False) == 0

    admin = clients["llmfleet"]
    day = utc_day(first.enqueued_ms)
    record = await admin.hgetall(producer.keys.usage(day, "alice", "tiny"))
    assert record == {"requests": "2", "errors": "0", "prompt_tokens": "22", "completion_tokens": "28"}
    errors = await admin.hgetall(producer.keys.usage(day, "alice", "big"))
    assert errors == {"requests": "1", "errors": "1", "prompt_tokens": "0", "completion_tokens": "0"}
    members = await admin.smembers(producer.keys.usage_index(day))
    assert sorted(tuple(json.loads(member)) for member in members) == [("alice", "big"), ("alice", "tiny")]
    # Kept for the retention, counted from the day's last answer.
    assert 399 * 86400 < await admin.ttl(producer.keys.usage(day, "alice", "tiny")) <= 400 * 86400
    # The budgets' counters have the tokens used, nothing held (no budget applied).
    day_spend, month_spend = await spend(admin, first)
    assert day_spend == month_spend == {"used": "50"}

    # The report reads them as the gateway's user may (read-only on usage:*).
    today = datetime.fromtimestamp(first.enqueued_ms / 1000, UTC).date()
    report = await read_report(clients["gateway"], producer.keys, today, today, "alice", None)
    assert report.as_json()["totals"] == {"requests": 3, "errors": 1, "prompt_tokens": 22, "completion_tokens": 28}
    assert [(row.model, row.requests) for row in report.rows] == [("big", 1), ("tiny", 2)]


async def test_a_tier_budget_holds_estimates_and_charges_what_was_used(clients: dict[str, aioredis.Redis]) -> None:
    producer = Producer(clients["gateway"], QUEUE, "gw")
    consumer = Consumer(clients["worker"], clients["worker"], QUEUE, "worker-1")
    await producer.ensure_groups(["tiny"])
    admin = clients["llmfleet"]
    await admin.hset(producer.keys.budgets, mapping={"daily:tier:free": 100, "monthly:tier:free": 1000})
    # Each costs 10 + 30 = 40: two fit the 100 tokens, the third would take the subject to 120.
    first, second, third = job("bob"), job("bob"), job("bob")
    assert (await admit(producer, first, "free")).outcome == "admitted"
    assert (await admit(producer, second, "free")).outcome == "admitted"
    refused = await admit(producer, third, "free")
    assert refused.outcome == "over_budget" and refused.budget is not None
    assert (refused.budget.period, refused.budget.scope, refused.budget.name) == ("daily", "tier", "free")
    assert (refused.budget.budget, refused.budget.spent, refused.budget.cost) == (100, 80, 40)
    # Refused: nothing queued, nothing held.
    assert not await admin.exists(producer.keys.job(third.id))
    assert (await spend(admin, first))[0] == {"held": "80"}
    # Another subject of the tier has a budget of its own.
    assert (await admit(producer, job("carol"), "free")).outcome == "admitted"

    # The first answer used 10 + 5: its 40 held become 15 used, and the third request now fits (15 + 40 + 40).
    entries = await taken(consumer)
    assert await run_and_deliver(consumer, entries[first.id], first, answer(10, 5)) == 1
    assert (await spend(admin, first))[0] == {"held": "40", "used": "15"}
    assert (await admit(producer, third, "free")).outcome == "admitted"

    # A subject's own budget replaces its tier's: 0 is none at all for it, whatever the tier says.
    await admin.hset(producer.keys.budgets, "daily:sub:bob", 0)
    assert (await admit(producer, job("bob", max_tokens=5000), "free")).outcome == "over_budget"  # the monthly one
    await admin.hset(producer.keys.budgets, "monthly:sub:bob", 0)
    assert (await admit(producer, job("bob", max_tokens=5000), "free")).outcome == "admitted"
    # A subject without a tier budget: its own.
    await admin.hset(producer.keys.budgets, "monthly:sub:dave", 50)
    over = await admit(producer, job("dave"), "default")
    assert over.outcome == "admitted"
    over = await admit(producer, job("dave"), "default")
    assert over.budget is not None and (over.budget.period, over.budget.scope, over.budget.name) == (
        "monthly",
        "sub",
        "dave",
    )


async def test_the_benchmarks_baseline_consumer_delivers_and_records_nothing(
    clients: dict[str, aioredis.Redis],
) -> None:
    """`llmfleet bench usage` compares the worker's consumer with this one: it must differ only in the records."""
    producer = Producer(clients["gateway"], QUEUE, "gw")
    baseline = Consumer(clients["worker"], clients["worker"], QUEUE, "worker-1", record_usage=False)
    await producer.ensure_groups(["tiny"])
    queued = job("carol")
    assert (await admit(producer, queued)).outcome == "admitted"
    entries = await taken(baseline)
    assert await run_and_deliver(baseline, entries[queued.id], queued, answer(10, 25)) == 1

    admin = clients["llmfleet"]
    assert json.loads(await admin.get(producer.keys.result(queued.id)))["status"] == 200
    day = utc_day(queued.enqueued_ms)
    assert await admin.exists(producer.keys.usage(day, "carol", "tiny"), producer.keys.usage_index(day)) == 0
    assert await spend(admin, queued) == [{}, {}]


def test_the_usage_benchmark_runs_both_arms_against_a_real_redis(tmp_path: Path) -> None:
    """A short run of the command scripts/bench.sh runs: it starts its own redis-server and writes its figures."""
    out = tmp_path / "usage.json"
    finished = subprocess.run(
        [sys.executable, "-m", "llmfleet", "bench", "usage", "--rounds", "2", "--requests", "100", "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "CPU a request to the whole path" in finished.stdout
    figures = json.loads(out.read_text())
    assert [r["arm"] for r in figures["rounds"]] == ["records", "baseline", "baseline", "records"]
    for measured in figures["rounds"]:
        assert measured["requests"] == 100
        assert measured["client_cpu_s"] > 0 and measured["redis_cpu_s"] > 0 and measured["scripts_s"] > 0
