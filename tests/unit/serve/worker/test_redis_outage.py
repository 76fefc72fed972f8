"""The worker's Redis retry policy (llmfleet/serve/worker/outage.py): its two layers and where they apply.

Layer 1 is checked on the clients the worker builds, and against a FAKE Redis
on a loopback port that accepts connections and closes them at once (a Redis
going away, which a real one does not do on demand). Layer 2 is checked with
steps that fail as a test says; the real Redis restart is in
tests/integration/serve/worker/test_worker_http.py and
tests/integration/serve/gateway/test_gateway.py.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from redis.backoff import EqualJitterBackoff, ExponentialWithJitterBackoff
from redis.exceptions import (
    BusyLoadingError,
    NoPermissionError,
    OutOfMemoryError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmfleet.serve.queue.jobs import Job, now_ms
from llmfleet.serve.worker import outage
from llmfleet.serve.worker.app import Worker, redis_clients
from llmfleet.serve.worker.config import WorkerSettings
from llmfleet.serve.worker.job import ChunkRelay, with_redis
from llmfleet.serve.worker.outage import OUTAGE_ERRORS, RedisOutage, outage_retry


@pytest.fixture
def closing_redis() -> Iterator[tuple[int, list[int]]]:
    """A FAKE Redis: (its port, a one-item list counting connections), each closed as soon as it is accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = [0]

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted[0] += 1
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        server.close()
        thread.join(timeout=5)


def settings(port: int = 6379) -> WorkerSettings:
    return WorkerSettings(
        engines=("http://127.0.0.1:8000",),
        id="w-test",
        redis={"url": f"redis://127.0.0.1:{port}/0"},  # type: ignore[arg-type]  # validated into RedisSettings
    )


# -- layer 1: the clients --------------------------------------------------------


def test_both_worker_clients_carry_a_bounded_exponential_retry_on_connection_and_timeout_errors() -> None:
    async def main() -> None:
        clients = redis_clients(settings())
        try:
            for client in clients:
                retry = client.get_retry()
                assert retry is not None
                assert retry.get_retries() == outage.CLIENT_RETRIES
                backoff = retry._backoff
                assert isinstance(backoff, ExponentialWithJitterBackoff)
                assert max(backoff.compute(failures) for failures in range(1, 40)) <= 1.0
                # The errors each connection retries: those of the Retry plus the pool's retry_on_error.
                connection = client.connection_pool.make_connection()
                retried = tuple(connection.retry._supported_errors)
                for error in (*outage.CLIENT_RETRY_ON, BusyLoadingError):
                    assert issubclass(error, retried), error
                for error in (ResponseError, NoPermissionError, OutOfMemoryError):
                    assert not issubclass(error, retried), error
        finally:
            for client in clients:
                await client.aclose()

    asyncio.run(main())


def test_a_client_retries_a_dropped_connection_a_bounded_number_of_times_then_raises(
    closing_redis: tuple[int, list[int]],
) -> None:
    port, accepted = closing_redis

    async def main() -> None:
        client, blocking = redis_clients(settings(port))
        try:
            with pytest.raises(RedisConnectionError):
                await client.ping()
        finally:
            await client.aclose()
            await blocking.aclose()

    asyncio.run(main())
    # redis-py retries the connect inside each try of the command: (1 + retries) tries of (1 + retries) connects.
    assert accepted[0] == (1 + outage.CLIENT_RETRIES) ** 2


# -- layer 2: RedisOutage ----------------------------------------------------------


class Flaky:
    """A step that raises the given errors one by one, then returns "done"."""

    def __init__(self, *errors: RedisError) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def fast_outage(down: Callable[[], None] = lambda: None) -> RedisOutage:
    """The real policy with its waits cut short (the waits themselves are checked on outage_retry())."""
    policy = RedisOutage(down=down)
    policy.retry._backoff = EqualJitterBackoff(cap=0.002, base=0.001)
    return policy


def test_the_outage_retry_has_no_limit_on_tries_a_bounded_wait_and_only_outage_errors() -> None:
    retry = outage_retry()
    assert retry.get_retries() == -1  # each call gives up on its own terms
    assert set(retry._supported_errors) == set(OUTAGE_ERRORS)
    assert {RedisConnectionError, RedisTimeoutError, OutOfMemoryError} == set(OUTAGE_ERRORS)
    waits = [retry._backoff.compute(failures) for failures in range(1, 60)]
    assert all(wait <= outage.OUTAGE_BACKOFF_CAP_S for wait in waits)
    assert min(waits[20:]) >= outage.OUTAGE_BACKOFF_CAP_S / 2  # a long outage: about one try a second or two


@pytest.mark.parametrize(
    "error",
    [
        RedisConnectionError("refused"),
        BusyLoadingError("loading"),
        RedisTimeoutError("timed out"),
        OutOfMemoryError("OOM"),
    ],
)
def test_an_outage_is_ridden_out_and_marks_redis_down_meanwhile(error: RedisError) -> None:
    downs: list[int] = []
    step = Flaky(error, error, error)
    value = asyncio.run(fast_outage(lambda: downs.append(1)).call("test", step, give_up=lambda: False))
    assert (value, step.calls, len(downs)) == ("done", 4, 3)


@pytest.mark.parametrize("error", [ResponseError("WRONGTYPE"), NoPermissionError("NOPERM"), ResponseError("NOGROUP")])
def test_an_error_that_is_no_outage_comes_out_at_once(error: RedisError) -> None:
    step = Flaky(error)
    with pytest.raises(type(error)):
        asyncio.run(fast_outage().call("test", step, give_up=lambda: False))
    assert step.calls == 1


def test_an_outage_comes_out_once_the_step_gives_up() -> None:
    step = Flaky(*[RedisConnectionError(f"refused {n}") for n in range(10)])
    with pytest.raises(RedisConnectionError, match="refused 2"):
        asyncio.run(fast_outage().call("test", step, give_up=lambda: step.calls >= 3))
    assert step.calls == 3


# -- where the worker applies it ------------------------------------------------------


def job(deadline_ms: int) -> Job:
    return Job(
        id="r1",
        kind="chat",
        model="tiny",
        payload={"messages": []},
        stream=True,
        reply="k",
        subject="s",
        tenant="t",
        lane="normal",
        prompt_tokens=1,
        max_tokens=10,
        enqueued_ms=now_ms(),
        deadline_ms=deadline_ms,
        queue_deadline_ms=deadline_ms,
    )


@pytest.mark.parametrize(
    ("past_deadline_ms", "retried"),
    [(0, True), (outage.DELIVER_GRACE_MS - 5_000, True), (outage.DELIVER_GRACE_MS + 5_000, False)],
)
def test_a_job_step_is_retried_until_the_deadline_plus_the_grace_to_deliver(
    past_deadline_ms: int, retried: bool
) -> None:
    worker = Worker(settings())
    worker.outage = fast_outage(worker._redis_down)
    worker.redis_ok = True
    step = Flaky(RedisConnectionError("refused"))

    async def main() -> str:
        return await with_redis(worker.outage, job(now_ms() - past_deadline_ms), step)

    if retried:
        assert asyncio.run(main()) == "done"
        assert step.calls == 2
    else:
        with pytest.raises(RedisConnectionError):
            asyncio.run(main())
        assert step.calls == 1
    assert worker.redis_ok is False


class ChunkQueue:
    """Stands in for the queue's Consumer.chunk: fails as told, records (call number, text) of each try."""

    def __init__(self, *errors: RedisError) -> None:
        self.errors = list(errors)
        self.tries: list[tuple[int, str]] = []

    async def chunk(self, _job: Job, _attempt: int, call: int, text: str, _tokens: int, _chunks: list[str]) -> int:
        self.tries.append((call, text))
        if self.errors:
            raise self.errors.pop(0)
        return len(self.tries)


def relay_run(queue: ChunkQueue, deadline_ms: int) -> tuple[ChunkRelay, BaseException | None]:
    async def main() -> tuple[ChunkRelay, BaseException | None]:
        relay = ChunkRelay(queue, job(deadline_ms), 1, fast_outage())  # type: ignore[arg-type]
        relay.add("{}", "hello", 1)
        try:
            await relay.close()
        except RedisError as error:
            return relay, error
        return relay, None

    return asyncio.run(main())


def test_chunks_are_published_through_an_outage_with_the_same_call_number() -> None:
    queue = ChunkQueue(RedisConnectionError("refused"), BusyLoadingError("loading"))
    relay, error = relay_run(queue, now_ms() + 60_000)
    assert error is None and relay.error is None
    assert queue.tries == [(1, "hello")] * 3  # one call, tried three times: applied once by its number


def test_chunks_past_the_deadline_are_not_retried() -> None:
    queue = ChunkQueue(RedisConnectionError("refused"))
    _relay, error = relay_run(queue, now_ms() - 1)
    assert isinstance(error, RedisConnectionError)
    assert queue.tries == [(1, "hello")]


class HealthyPool:
    def reports(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(healthy=True)]

    def served_models(self) -> set[str]:
        return {"tiny"}


class TakeQueue:
    """Stands in for the queue's Consumer in the take loop: each take raises the next error, then finds nothing."""

    def __init__(self, *errors: RedisError, forever: RedisError | None = None) -> None:
        self.errors = list(errors)
        self.forever = forever
        self.takes = 0
        self.groups_made = 0
        self.followed: set[str] = set()

    async def follow(self, models: set[str]) -> None:
        self.followed = models

    async def take(self, _count: int) -> list[Any]:
        self.takes += 1
        if self.errors:
            raise self.errors.pop(0)
        if self.forever is not None:
            raise self.forever
        return []

    async def wait_take(self, _count: int, _block_ms: int) -> list[Any]:
        await asyncio.sleep(0.005)
        return []

    async def ensure_groups(self) -> None:
        self.groups_made += 1


def run_take_loop(queue: TakeQueue) -> Worker:
    """Run the take loop for 0.2 s, then drain: it must stop within a second, with no error."""
    worker = Worker(settings())
    worker.outage = fast_outage(worker._redis_down)
    worker.pool = HealthyPool()  # type: ignore[assignment]
    worker.consumer = queue  # type: ignore[assignment]

    async def main() -> None:
        task = asyncio.create_task(worker._take_loop())
        await asyncio.sleep(0.2)
        assert not task.done(), task
        worker.draining = True
        await asyncio.wait_for(task, 1.0)

    asyncio.run(main())
    return worker


def test_the_take_loop_rides_out_an_outage_and_still_stops_on_a_drain() -> None:
    queue = TakeQueue(forever=RedisConnectionError("refused"))
    worker = run_take_loop(queue)
    assert queue.takes > 10
    assert worker.redis_ok is False


def test_the_take_loop_marks_redis_up_again_and_remakes_lost_consumer_groups() -> None:
    queue = TakeQueue(RedisConnectionError("refused"), ResponseError("NOGROUP No such key or consumer group"))
    worker = run_take_loop(queue)
    assert queue.groups_made == 1
    assert worker.redis_ok is True
