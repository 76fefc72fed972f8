"""The worker's engine pool and engine calls, without a network: balancing, ejection, continuation."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from llmfleet.queue.jobs import Job, now_ms
from llmfleet.worker.engine import EngineCaller, EngineFailure, StreamState, normalize_error
from llmfleet.worker.metrics import WorkerMetrics
from llmfleet.worker.pool import EnginePool

ENGINES = ("http://a:8000", "http://b:8000", "http://c:8000")


def engines_answering(health: dict[str, int]) -> httpx.AsyncClient:
    """A client whose engines answer /health with the given status and serve "tiny"."""

    def handle(request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if request.url.path == "/health":
            return httpx.Response(health.get(base, 200))
        return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 2048}]})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def pool(health: dict[str, int] | None = None, **options: Any) -> EnginePool:
    return EnginePool(ENGINES, engines_answering(health or {}), WorkerMetrics(), **options)


def test_least_outstanding_requests_then_round_robin() -> None:
    engines = pool()
    asyncio.run(engines.check_all())
    assert [engines.pick("tiny").url for _ in range(3)] == list(ENGINES)  # ties: in turn
    a, b, _c = engines.engines
    with engines.using(a), engines.using(a), engines.using(b):
        assert engines.pick("tiny").url == "http://c:8000"
        assert engines.pick("tiny", frozenset({"http://c:8000"})).url == "http://b:8000"
    assert engines.pick("other") is None


def test_unhealthy_engines_are_skipped_and_excluding_all_still_picks_one() -> None:
    engines = pool({"http://a:8000": 503, "http://b:8000": 503})
    asyncio.run(engines.check_all())
    assert {engines.pick("tiny").url for _ in range(4)} == {"http://c:8000"}
    assert engines.pick("tiny", frozenset({"http://c:8000"})).url == "http://c:8000"
    assert [report.healthy for report in engines.reports()] == [False, False, True]


def test_a_drained_engine_gets_nothing_new_and_says_so_until_undrained() -> None:
    engines = pool()
    asyncio.run(engines.check_all())
    engines.set_drained({"http://a:8000"})
    assert {engines.pick("tiny").url for _ in range(4)} == {"http://b:8000", "http://c:8000"}
    reports = {report.url: report for report in engines.reports()}
    assert (reports["http://a:8000"].drained, reports["http://a:8000"].healthy) == (True, False)
    assert engines.changed.is_set(), "draining wakes requests waiting for an engine"
    engines.set_drained(set())
    assert {engines.pick("tiny").url for _ in range(3)} == set(ENGINES)
    assert not any(report.drained for report in engines.reports())


def test_ejection_after_failures_and_readmission_only_after_the_ejection_time() -> None:
    engines = pool(eject_after=2, eject_s=0.2)
    asyncio.run(engines.check_all())
    a = engines.engines[0]
    engines.failed(a, "engine_5xx")
    assert a.healthy  # one failure is not enough
    engines.failed(a, "engine_5xx")
    assert not a.healthy
    asyncio.run(engines.check_all())
    assert not a.healthy  # /health says 200, but the ejection time has not passed
    asyncio.run(asyncio.sleep(0.25))
    asyncio.run(engines.check_all())
    assert a.healthy and a.consecutive_failures == 0
    assert engines.metrics.engine_ejections.labels(a.url)._value.get() == 1


def job(kind: str = "chat", **payload: Any) -> Job:
    now = now_ms()
    body = {"model": "tiny", "max_tokens": 10, **payload}
    return Job(
        id="r1",
        kind="chat" if kind == "chat" else "completion",
        model="tiny",
        payload=body,
        stream=True,
        reply="k",
        subject="s",
        tenant="t",
        lane="normal",
        prompt_tokens=5,
        max_tokens=10,
        enqueued_ms=now,
        deadline_ms=now + 1000,
        queue_deadline_ms=now + 1000,
    )


def caller() -> EngineCaller:
    return EngineCaller(
        pool=pool(),
        http=httpx.AsyncClient(),
        consumer=None,  # type: ignore[arg-type]  # _continuation never touches the queue
        metrics=WorkerMetrics(),
        worker_id="w",
        retries=1,
        retry_backoff_s=0,
        request_timeout_s=1,
        health_interval_s=1,
    )


def test_a_continuation_carries_on_from_the_text_already_sent() -> None:
    messages = [{"role": "user", "content": "hi"}]
    payload = caller()._continuation(job(messages=messages), StreamState(text=["Hel", "lo"], tokens=4))
    assert payload is not None
    assert payload["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert payload["continue_final_message"] is True and payload["add_generation_prompt"] is False
    assert payload["max_tokens"] == 6 and payload["stream"] is True
    completion = caller()._continuation(job("completion", prompt="Once"), StreamState(text=[" upon"], tokens=1))
    assert completion is not None and completion["prompt"] == "Once upon" and completion["max_tokens"] == 9
    assert caller()._continuation(job(messages=messages), StreamState(text=["x"], tokens=10)) is None
    with pytest.raises(EngineFailure, match="token ids cannot be continued"):
        caller()._continuation(job("completion", prompt=[1, 2]), StreamState(text=["x"], tokens=1))
    fresh = caller()._continuation(job(messages=messages), StreamState(text=[], tokens=0))
    assert fresh is not None and fresh["messages"] == messages and fresh["max_tokens"] == 10


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (json.dumps({"error": {"message": "too long", "type": "BadRequestError", "code": 400}}), "too long"),
        (json.dumps({"object": "error", "message": "old style", "type": "BadRequestError", "code": 400}), "old style"),
        ("plain text", "plain text"),
    ],
)
def test_engine_errors_come_out_in_openai_shape(content: str, message: str) -> None:
    body = normalize_error(400, content.encode())
    assert body["error"]["message"] == message
