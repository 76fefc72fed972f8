"""A waiter whose job Redis lost is told so at its next poll; an unreachable Redis is not a loss; the polls back off,
and a waiter the reply listener tells to check does so at once (service._next)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from llmfleet.serve.gateway import service
from llmfleet.serve.gateway.routes.tasks import AdmittedTasks
from llmfleet.serve.queue.jobs import Job, Result, now_ms
from llmfleet.serve.queue.producer import Waiter


class Producer:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.polls = 0

    async def poll(self, request_id: str) -> Any:
        self.polls += 1
        answer = self.answers.pop(0) if self.answers else "pending"
        if isinstance(answer, Exception):
            raise answer
        return answer


def job(deadline_s: float = 30) -> Job:
    now = now_ms()
    return Job(
        id="abc",
        kind="chat",
        model="tiny",
        payload={},
        stream=False,
        reply="p:reply:gw",
        subject="alice",
        tenant="",
        lane="normal",
        prompt_tokens=1,
        max_tokens=1,
        enqueued_ms=now,
        deadline_ms=now + int(deadline_s * 1000),
        queue_deadline_ms=now + int(deadline_s * 1000),
    )


def next_event(answers: list[Any]) -> tuple[Any, int]:
    producer = Producer(answers)
    state = SimpleNamespace(settings=SimpleNamespace(result_poll_s=0.01, result_poll_max_s=0.01), producer=producer)
    the_job = job()
    event = asyncio.run(service._next(state, the_job, Waiter(the_job.id, the_job.deadline_ms), None))  # type: ignore[arg-type]
    return event, producer.polls


def test_the_polls_of_a_long_wait_back_off_to_their_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 34: 600 requests waiting in a backlog, each polling every 2 s, emptied the gateway's Redis pool.
    # A job with 1 s to its deadline polls from 10 ms doubling to 80 ms (less a quarter at most, the jitter): about
    # 4 + 1 s / 80 ms of them. Polling every 10 ms throughout would be over a hundred.
    monkeypatch.setattr(service, "DEADLINE_GRACE_MS", 0)
    producer = Producer([])
    state = SimpleNamespace(settings=SimpleNamespace(result_poll_s=0.01, result_poll_max_s=0.08), producer=producer)
    the_job = job(deadline_s=1)
    event = asyncio.run(service._next(state, the_job, Waiter(the_job.id, the_job.deadline_ms), None))  # type: ignore[arg-type]
    assert event == "timeout"
    assert 4 <= producer.polls <= 4 + 1 / 0.06, producer.polls


def test_a_waiter_told_to_check_polls_at_once_without_waiting_out_its_interval() -> None:
    result = Result(200, {"ok": 1})
    producer = Producer([result])
    state = SimpleNamespace(settings=SimpleNamespace(result_poll_s=60, result_poll_max_s=60), producer=producer)
    the_job = job(deadline_s=120)
    waiter = Waiter(the_job.id, the_job.deadline_ms)

    async def scenario() -> Any:
        waiting = asyncio.ensure_future(service._next(state, the_job, waiter, None))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert not waiting.done() and producer.polls == 0
        waiter.check_now.set()  # what the reply listener does once it is past a Redis error
        return await asyncio.wait_for(waiting, timeout=10)

    assert asyncio.run(scenario()) is result
    assert producer.polls == 1
    assert not waiter.check_now.is_set(), "the waiter takes the request to check, so the next wait is a full one"


def test_a_job_gone_from_redis_is_reported_lost_at_the_poll_that_finds_it() -> None:
    assert next_event(["pending", "pending", "lost"]) == ("lost", 3)


def test_an_unreachable_redis_is_not_a_loss_and_the_wait_goes_on() -> None:
    result = Result(200, {"ok": 1})
    event, polls = next_event([RedisConnectionError("refused"), RedisConnectionError("refused"), result])
    assert (event, polls) == (result, 3)


def test_tasks_admitted_here_are_known_to_their_subject_until_their_deadline() -> None:
    tasks = AdmittedTasks(limit=2)
    tasks.add("a", "alice", now_ms() + 60_000)
    assert tasks.known("a", "alice")
    assert not tasks.known("a", "mallory")
    assert not tasks.known("b", "alice")
    tasks.add("b", "alice", now_ms() + 60_000)
    tasks.add("c", "alice", now_ms() + 60_000)
    assert not tasks.known("a", "alice"), "over the limit, the oldest is dropped"
    tasks.add("d", "alice", now_ms() - 1)
    assert not tasks.known("d", "alice"), "past its deadline a task's record may be gone for good reasons"


def test_the_lost_error_is_openai_shaped_and_retryable() -> None:
    body = service.lost_body()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "request_lost"
    assert body["error"]["type"] == "server_error"
    assert service.LOST_RETRY_AFTER_S >= 1
