"""The worker: takes requests from the queue, calls engines, delivers each result once.

Length: over 500 lines because the tasks below share one loop's state.

Tasks of one worker process (all on one asyncio loop):
- take: up to `concurrency` requests in flight; highest lane first;
- reclaim: XAUTOCLAIM entries idle past claim_idle_ms (their worker died);
- heartbeat: TOUCH held entries; cancel requests whose client went away;
- cancel listener: the gateways' PUBLISH on <prefix>:cancel stops a request at once;
- health: the engine pool's checks; report: the engine registry and queue gauges;
- http: /metrics, /healthz, /readyz on listen_host:listen_port (aiohttp.web).

Redis going away (outage.py has the whole policy): each client retries a
command briefly (redis-py's Retry); a restart is ridden out by one more Retry,
without a limit on tries, around start-up, taking work, each queue step of a
job (until its deadline plus a grace) and the cancel channel. Taken entries
stay pending meanwhile: if the worker dies, another one reclaims them.

HTTP listener (the role's healthcheck and deploy check, Prometheus), any
method: /healthz 200 "ok"; /readyz 200 "ready" or 503 with the reason
("draining", "redis unreachable", "no healthy engine"); /metrics; else 404
"not found". One line of text/plain without a charset; /metrics is
prometheus_client's CONTENT_TYPE_LATEST.

SIGTERM drains: stop taking work, let in-flight requests finish within
drain_timeout_s, hand back the rest (idle set far past claim_idle_ms, so the
next XAUTOCLAIM anywhere takes them at their place in the queue), exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from llmfleet.serve.queue import registry
from llmfleet.serve.queue.consumer import Consumer, Entry
from llmfleet.serve.queue.jobs import Job, Result, error_body, now_ms, usage_tokens
from llmfleet.serve.worker.config import WorkerSettings
from llmfleet.serve.worker.engine import POISON_CODE, EngineCaller, Fenced, engine_session
from llmfleet.serve.worker.metrics import WorkerMetrics
from llmfleet.serve.worker.outage import DELIVER_GRACE_MS, RedisOutage
from llmfleet.serve.worker.pool import EnginePool

log = logging.getLogger(__name__)

T = TypeVar("T")
OUTCOMES = {1: "answer", 0: "duplicate", -1: "fenced"}


@dataclass
class InFlight:
    entry: Entry
    task: asyncio.Task[None] | None = None
    work: asyncio.Task[Result] | None = None
    job: Job | None = None
    stop_reason: str | None = None  # "client" or "drain"


def redis_clients(settings: WorkerSettings) -> tuple[aioredis.Redis, aioredis.Redis]:
    """The worker's clients: one for commands, one for blocking reads; each retries as outage.py says (layer 1)."""
    commands = settings.redis.client(name=settings.id)
    blocking = settings.redis.client(blocking_s=settings.block_ms / 1000, name=f"{settings.id}-read")
    return commands, blocking


def past_queue_timeout(job: Job, entry: Entry, attempt: int, now: int) -> bool:
    """Whether a request waited past its queue timeout for its first worker.

    The queue timeout bounds the wait for a first delivery only. A request
    another worker had already taken (reclaimed: that worker died, stalled or
    handed it back while draining) or started (attempt 2 or later) is run
    however long the redelivery took: the client's own deadline (job.deadline_ms,
    which the gateway waits for and the engine call is cut to) governs it, not
    the time spent being reclaimed.
    """
    return not entry.reclaimed and attempt <= 1 and now > job.queue_deadline_ms


class Worker:
    def __init__(self, settings: WorkerSettings, metrics: WorkerMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or WorkerMetrics()
        self.id = settings.id
        self.inflight: dict[str, InFlight] = {}
        self.draining = False
        self.closing = False
        self.redis_ok = False
        self._slot_free = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._loops: list[asyncio.Task[None]] = []
        self._http_runner: web.AppRunner | None = None
        self.outage = RedisOutage(down=self._redis_down)
        self.client: aioredis.Redis | None = None
        self.blocking: aioredis.Redis | None = None
        self.http: aiohttp.ClientSession | None = None

    # -- start and stop -------------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        self.client, self.blocking = redis_clients(settings)
        self.consumer = Consumer(self.client, self.blocking, settings.queue, self.id)
        self.http = engine_session(
            settings.concurrency, settings.connect_timeout_s, settings.queue.request_timeout_s, settings.engine_key()
        )
        self.pool = EnginePool(
            settings.engines,
            self.http,
            self.metrics,
            health_interval_s=settings.health_interval_s,
            health_timeout_s=settings.health_timeout_s,
            eject_after=settings.eject_after,
            eject_s=settings.eject_s,
            policy=settings.policy,
            model_policies=settings.model_policies,
            affinity_epsilon=settings.affinity_epsilon,
            affinity_prefix_chars=settings.affinity_prefix_chars,
        )
        self.caller = EngineCaller(
            pool=self.pool,
            http=self.http,
            consumer=self.consumer,
            metrics=self.metrics,
            worker_id=self.id,
            retries=settings.retries,
            retry_backoff_s=settings.retry_backoff_s,
            request_timeout_s=settings.queue.request_timeout_s,
            health_interval_s=settings.health_interval_s,
            poison_after=settings.queue.poison_after,
            outage=self.outage,
        )
        self.metrics.capacity.set(settings.concurrency)
        if settings.listen_port:
            # Up before Redis: /healthz answers, and /readyz says why the worker is not ready yet.
            self._http_runner = web.AppRunner(self.http_app(), access_log=None)
            await self._http_runner.setup()
            await web.TCPSite(self._http_runner, settings.listen_host, settings.listen_port).start()
        await self.pool.check_all()
        await self.outage.call("connecting", self._first_contact, give_up=lambda: False)
        self._background = [
            asyncio.create_task(self.pool.run_checks(), name="health"),
            asyncio.create_task(self._every(settings.health_interval_s, self._report), name="report"),
            asyncio.create_task(self._every(settings.heartbeat_s, self._heartbeat), name="heartbeat"),
            asyncio.create_task(self._listen_cancels(), name="cancels"),
        ]
        self._loops = [
            asyncio.create_task(self._take_loop(), name="take"),
            asyncio.create_task(
                self._every(settings.queue.claim_idle_ms / 2000, self._reclaim, until_drain=True), name="reclaim"
            ),
        ]
        log.info(
            "worker %s started: %d engines, concurrency %d, lanes %s",
            self.id,
            len(settings.engines),
            settings.concurrency,
            ", ".join(settings.queue.lanes),
        )

    async def drain(self) -> None:
        """Stop taking work, finish in-flight requests within drain_timeout_s, hand back the rest."""
        self.draining = True
        self.metrics.draining.set(1)
        log.info("worker %s draining: %d requests in flight", self.id, len(self.inflight))
        try:
            await self._report()  # tells the gateways now, not after engine_stale_s
        except RedisError as error:
            log.warning("draining: could not report it to redis: %s", error)
        # The loops see `draining` within one blocking read; what they took meanwhile is handed back.
        _done, stuck = await asyncio.wait(self._loops, timeout=self.settings.block_ms / 1000 + 5)
        await cancel_and_wait(stuck, 2.0)
        pending = [record.task for record in self.inflight.values() if record.task is not None]
        if pending:
            _done, still = await asyncio.wait(pending, timeout=self.settings.drain_timeout_s)
            if still:
                log.warning("drain deadline passed: handing back %d unfinished requests", len(still))
                for record in list(self.inflight.values()):
                    record.stop_reason = "drain"
                    if record.work is not None:
                        record.work.cancel()
                await asyncio.wait(still, timeout=10)

    async def close(self) -> None:
        self.closing = True
        await cancel_and_wait(self._background + self._loops, 3.0)
        if self.client is not None:
            try:
                await registry.withdraw(self.client, self.consumer.keys, self.id)
            except RedisError as error:  # the report expires after engine_stale_s anyway
                log.warning("could not withdraw this worker's engine report: %s", error)
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self.http is not None:
            await self.http.close()
        for client in (self.client, self.blocking):
            if client is not None:
                await client.aclose()

    # -- loops ----------------------------------------------------------------

    async def _every(
        self, interval_s: float, step: Callable[[], Awaitable[None]], *, until_drain: bool = False
    ) -> None:
        while not self.closing and not (until_drain and self.draining):
            await asyncio.sleep(interval_s)
            try:
                await step()
            except RedisError as error:
                self.redis_ok = False
                log.warning("%s: redis: %s", step.__name__, error)
            except Exception:  # a loop must not die quietly: log it and carry on
                log.exception("%s failed", step.__name__)

    async def _first_contact(self) -> None:
        """The first report, which makes sure of the groups; one step with the outage handling."""
        await self._report()  # sets redis_ok: /readyz says ready from here on

    def _redis_down(self) -> None:
        self.redis_ok = False

    def _is_draining(self) -> bool:
        return self.draining

    def _free_slots(self) -> int:
        return self.settings.concurrency - len(self.inflight)

    async def _take(self, free: int, models: set[str]) -> list[Entry]:
        await self.consumer.follow(models)
        entries = await self.consumer.take(free)
        return entries or await self.consumer.wait_take(free, self.settings.block_ms)

    async def _take_loop(self) -> None:
        while not self.draining:
            free = self._free_slots()
            if free <= 0:
                self._slot_free.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_free.wait(), 1.0)
                continue
            models = self.pool.served_models()
            if not models:
                # Taking work no engine can do would only make it wait here instead of in the queue.
                await self.pool.wait_changed(self.settings.health_interval_s)
                continue
            try:
                entries = await self.outage.call(
                    "taking work", functools.partial(self._take, free, models), give_up=self._is_draining
                )
            except RedisError as error:
                if self.draining:  # the outage outlasted the loop: a drain takes nothing more
                    break
                if not (isinstance(error, ResponseError) and "NOGROUP" in str(error)):
                    raise
                log.warning("consumer groups are gone (Redis lost its data?); creating them again")
                await self.outage.call(
                    "creating the consumer groups", self.consumer.ensure_groups, give_up=self._is_draining
                )
                continue
            self.redis_ok = True
            for entry in entries:
                self._spawn(entry)

    async def _reclaim(self) -> None:
        free = self._free_slots()
        models = self.pool.served_models()
        if free <= 0 or self.draining or not models:
            return
        await self.consumer.follow(models)
        entries = await self.consumer.reclaim(free)
        for entry in entries:
            if entry.request_id in self.inflight:  # our own entry, gone idle while Redis was away
                continue
            log.info("reclaimed request %s (entry %s on lane %s)", entry.request_id, entry.entry_id, entry.lane)
            self.metrics.redeliveries.inc()
            self._spawn(entry)

    async def _heartbeat(self) -> None:
        records = list(self.inflight.values())
        if not records:
            return
        await self.consumer.touch(record.entry for record in records)
        cancelled = await self.consumer.cancelled([record.entry.request_id for record in records])
        for request_id in cancelled:
            self._cancel(request_id)
        self.redis_ok = True

    async def _listen_cancels(self) -> None:
        try:
            await self.outage.call("cancel channel", self._follow_cancels, give_up=lambda: self.closing)
        except Exception:  # not an outage: say so; the heartbeat still finds cancelled requests
            if not self.closing:
                log.exception("cancel channel failed; cancels reach this worker through its heartbeat only")

    async def _follow_cancels(self) -> None:
        """Follow the gateways' cancels until the worker closes."""
        assert self.client is not None
        async with self.client.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(self.consumer.keys.cancel_channel)
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    self._cancel(str(message["data"]))
        if not self.closing:  # the subscription ended under us: the outage policy subscribes again
            raise RedisConnectionError("the cancel channel's subscription ended")

    def _cancel(self, request_id: str) -> None:
        record = self.inflight.get(request_id)
        if record is None:
            return
        if record.work is None:  # taken, not started yet: _process checks the flag before it starts
            record.stop_reason = "client"
        elif not record.work.done():
            log.info("request %s: the client went away; cancelling the engine request", request_id)
            record.stop_reason = "client"
            record.work.cancel()

    async def _report(self) -> None:
        assert self.client is not None
        self.pool.set_drained({str(url) for url in await self.client.smembers(self.consumer.keys.drained)})
        await registry.publish(
            self.client,
            self.consumer.keys,
            self.id,
            self.pool.reports(),
            ttl_s=self.settings.queue.engine_stale_s,
            draining=self.draining,
        )
        await self.consumer.check_legacy()
        for (lane, model), backlog in (await self.consumer.backlog()).items():
            self.metrics.queue_depth.labels(lane, model).set(backlog.length)
            self.metrics.queue_pending.labels(lane, model).set(backlog.pending)
            self.metrics.queue_waiting.labels(lane, model).set(backlog.waiting)
            self.metrics.queue_oldest_wait.labels(lane, model).set(backlog.oldest_wait_s)
        self.redis_ok = True

    # -- one request ----------------------------------------------------------

    def _spawn(self, entry: Entry) -> None:
        record = InFlight(entry)
        self.inflight[entry.request_id] = record
        record.task = asyncio.create_task(self._handle(record), name=f"request-{entry.request_id}")
        self.metrics.inflight.set(len(self.inflight))

    async def _handle(self, record: InFlight) -> None:
        entry = record.entry
        try:
            if self.draining:
                await self.consumer.hand_back([entry])
                self.metrics.handed_back.inc()
                return
            await self._process(record)
        except RedisError as error:
            self.metrics.errors.labels("redis").inc()
            log.warning(
                "request %s: redis: %s; the entry stays pending and will be taken again", entry.request_id, error
            )
        except Exception:
            self.metrics.errors.labels("internal").inc()
            log.exception(
                "request %s: unexpected error; the entry stays pending and will be taken again", entry.request_id
            )
        finally:
            self.inflight.pop(entry.request_id, None)
            self.metrics.inflight.set(len(self.inflight))
            self._slot_free.set()

    async def _with_redis(self, job: Job, step: Callable[[], Awaitable[T]]) -> T:
        """A queue step of a job, through a Redis outage until the job's deadline plus DELIVER_GRACE_MS."""
        give_up_ms = job.deadline_ms + DELIVER_GRACE_MS
        return await self.outage.call(f"request {job.id}", step, give_up=lambda: now_ms() > give_up_ms)

    async def _process(self, record: InFlight) -> None:
        entry = record.entry
        try:
            job = Job.from_json(entry.fields["job"])
        except (KeyError, ValueError, TypeError) as error:
            self.metrics.errors.labels("malformed").inc()
            self.metrics.dead_letters.inc()
            log.error("entry %s on lane %s is malformed (%s); dead-lettering it", entry.entry_id, entry.lane, error)
            result = Result(500, error_body("the queued request was malformed", "internal_error", "malformed"))
            await self.consumer.dead_letter(entry, None, f"malformed entry: {error}", 0, result)
            return
        record.job = job
        start = await self._with_redis(job, lambda: self.consumer.begin(job.id))
        if start.outcome in ("done", "gone"):
            await self._with_redis(job, lambda: self.consumer.ack(entry))
            return
        if start.outcome == "dead":
            self.metrics.dead_letters.inc()
            message = f"gave up after {start.attempt - 1} attempts; last: {start.reason}"
            log.error("request %s: %s; dead-lettering it", job.id, message)
            result = Result(
                502, error_body(message, "engine_error", "dead_letter"), attempt=start.attempt, worker=self.id
            )
            outcome = await self._with_redis(
                job, lambda: self.consumer.dead_letter(entry, job, start.reason, start.attempt - 1, result)
            )
            self._recorded(job, result, outcome)
            return
        if start.outcome == "cancelled" or record.stop_reason == "client":
            log.info("request %s: the client went away before it started; not running it", job.id)
            result = Result(499, error_body("the client cancelled the request", "cancelled", "client_closed"))
            await self._deliver(entry, job, start.attempt, result)
            self.metrics.cancelled.inc()
            return
        attempt = start.attempt
        if start.attempt > 1:
            log.info("request %s: attempt %d (%d characters already streamed)", job.id, attempt, len(start.partial))
        self.metrics.queue_wait.labels(entry.lane).observe(max(now_ms() - job.enqueued_ms, 0) / 1000)
        if past_queue_timeout(job, entry, attempt, now_ms()):
            waited = (now_ms() - job.enqueued_ms) / 1000
            self.metrics.errors.labels("queue_timeout").inc()
            result = Result(
                504,
                error_body(
                    f"the request waited {waited:.1f} s in the queue, past its queue timeout",
                    "timeout",
                    "queue_timeout",
                ),
                attempt=attempt,
                worker=self.id,
            )
            await self._deliver(entry, job, attempt, result)
            return
        started = time.monotonic()
        record.work = asyncio.create_task(self.caller.run(job, attempt, start.partial, start.partial_tokens))
        cancelled = False
        try:
            result = await record.work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the worker itself is being torn down
            if record.stop_reason == "drain":
                await self.consumer.hand_back([entry], started=[job.id])
                self.metrics.handed_back.inc()
                log.info("request %s handed back unfinished (drain deadline)", job.id)
                return
            cancelled = True
            result = Result(
                499,
                error_body("the client went away; the request was cancelled", "cancelled", "client_closed"),
                attempt=attempt,
                worker=self.id,
            )
        except Fenced:
            self.metrics.errors.labels("fenced").inc()
            self.metrics.results.labels("fenced").inc()
            log.warning("request %s: attempt %d lost ownership to a newer attempt; dropping it", job.id, attempt)
            return
        finally:
            self.metrics.engine_time.labels(job.model).observe(time.monotonic() - started)
        if result.status == 422 and (result.body.get("error") or {}).get("code") == POISON_CODE:
            self.metrics.dead_letters.inc()
            reason = str(result.body["error"].get("message", "poison"))
            log.error("request %s: dead-lettered as poison: %s", job.id, reason)
            outcome = await self._with_redis(
                job, lambda: self.consumer.dead_letter(entry, job, reason, attempt, result)
            )
            self._recorded(job, result, outcome)
            return
        outcome = await self._deliver(entry, job, attempt, result)
        if cancelled:
            # Counted once the 499 is stored: whoever sees the count can already read the cancelled result.
            self.metrics.cancelled.inc()
        if outcome == 1 and result.ok:
            prompt, completion = usage_tokens(result.body)
            self.metrics.prompt_tokens.labels(job.model).inc(prompt)
            self.metrics.prompt_token_sizes.labels(job.model).observe(prompt)
            self.metrics.completion_tokens.labels(job.model).inc(completion)
            self.metrics.end_to_end.labels(job.model, job.lane).observe(max(now_ms() - job.enqueued_ms, 0) / 1000)

    async def _deliver(self, entry: Entry, job: Job, attempt: int, result: Result) -> int:
        # Streams are fenced: only the attempt that owns the request may answer (its chunks went out).
        # Before any attempt started (attempt 0: cancelled while queued) there is nothing to fence.
        fenced = job.stream and attempt > 0
        outcome = await self._with_redis(job, lambda: self.consumer.deliver(entry, job, attempt, result, fenced=fenced))
        self.metrics.results.labels(OUTCOMES.get(outcome, "unknown")).inc()
        if outcome == 0:
            log.info("request %s: attempt %d finished after an earlier result; discarded", job.id, attempt)
        self._recorded(job, result, outcome)
        return outcome

    def _recorded(self, job: Job, result: Result, outcome: int) -> None:
        """Count what DELIVER recorded in the usage records (only the first result of a request is)."""
        if outcome == 1:
            self.metrics.usage_requests.labels(job.model, "answered" if result.ok else "error").inc()

    # -- http -----------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if not self.redis_ok:
            return False, "redis unreachable"
        if not any(report.healthy for report in self.pool.reports()):
            return False, "no healthy engine"
        return True, "ready"

    def http_app(self) -> web.Application:
        """The listener for Prometheus and the health checks (answers as in the module docstring)."""
        app = web.Application()
        # Any method, as the listener always answered (aiohttp leaves out the body of a HEAD answer).
        app.router.add_route("*", "/metrics", self._metrics)
        app.router.add_route("*", "/healthz", self._healthz)
        app.router.add_route("*", "/readyz", self._readyz)
        app.router.add_route("*", "/{path:.*}", self._not_found)
        return app

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return _text(200, "ok")

    async def _readyz(self, _request: web.Request) -> web.Response:
        ok, reason = self.ready()
        return _text(200 if ok else 503, reason)

    async def _not_found(self, _request: web.Request) -> web.Response:
        return _text(404, "not found")


def _text(status: int, line: str) -> web.Response:
    """One line of plain text; Content-Type without a charset, as the hand-written listener sent it."""
    return web.Response(status=status, body=f"{line}\n".encode(), content_type="text/plain")


async def cancel_and_wait(tasks: Collection[asyncio.Task[Any]], timeout_s: float) -> None:
    """Cancel tasks and wait for them, at most timeout_s.

    Bounded on purpose: on Python 3.11, asyncio.wait_for (which redis-py uses
    for socket writes) can swallow a cancellation that races with the inner
    operation finishing, and the task then carries on. Loops here also stop
    on flags (`closing`, `draining`), so a swallowed cancel only delays them.
    """
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        log.warning("task %s did not stop within %.0f s of being cancelled", task.get_name(), timeout_s)


def _dump_tasks() -> None:
    """SIGUSR1: log every asyncio task's stack (what is this worker waiting on?)."""
    for task in asyncio.all_tasks():
        chain: list[str] = []
        awaitable: Any = task.get_coro()
        while awaitable is not None and len(chain) < 30:
            frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}:{frame.f_lineno}")
            awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
        log.warning("task %s: %s", task.get_name(), " -> ".join(chain) or repr(task))


async def run(settings: WorkerSettings) -> int:
    """Run a worker until SIGTERM or SIGINT, then drain and exit."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    worker = Worker(settings)
    try:
        starting = asyncio.create_task(worker.start())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # stopped while still waiting for Redis
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 0
        starting.result()
        await stopping
        await worker.drain()
    finally:
        await worker.close()
    log.info("worker %s stopped", worker.id)
    return 0
