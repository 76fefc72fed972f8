"""A waiter whose job Redis lost is told so at its next poll; an unreachable Redis is not a loss (service._next)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

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
    state = SimpleNamespace(settings=SimpleNamespace(result_poll_s=0.01), producer=producer)
    the_job = job()
    event = asyncio.run(service._next(state, the_job, Waiter(the_job.id, the_job.deadline_ms), None))  # type: ignore[arg-type]
    return event, producer.polls


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
