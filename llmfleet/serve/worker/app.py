"""The worker process: its loops, its HTTP listener, start, drain and close.

What happens to one request is elsewhere: its life in the queue (BEGIN to
DELIVER) in job.py, the engine call in engine.py. This module keeps the
process around them: which entries it holds (`inflight`), and these tasks of
one worker process (all on one asyncio loop):
- take: up to `concurrency` requests in flight; highest lane first; each
  taken entry runs as its own task (job.JobRunner.handle);
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
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from llmfleet.serve.queue import registry
from llmfleet.serve.queue.consumer import Consumer, Entry
from llmfleet.serve.worker.config import WorkerSettings
from llmfleet.serve.worker.engine import EngineCaller, engine_session
from llmfleet.serve.worker.job import InFlight, JobRunner
from llmfleet.serve.worker.metrics import WorkerMetrics
from llmfleet.serve.worker.outage import RedisOutage
from llmfleet.serve.worker.pool import EnginePool

log = logging.getLogger(__name__)


def redis_clients(settings: WorkerSettings) -> tuple[aioredis.Redis, aioredis.Redis]:
    """The worker's clients: one for commands, one for blocking reads; each retries as outage.py says (layer 1)."""
    commands = settings.redis.client(name=settings.id)
    blocking = settings.redis.client(blocking_s=settings.block_ms / 1000, name=f"{settings.id}-read")
    return commands, blocking


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
            slow_checks_to_remove=settings.slow_checks_to_remove,
            eject_after=settings.eject_after,
            eject_s=settings.eject_s,
            policy=settings.policy,
            model_policies=settings.model_policies,
            affinity_epsilon=settings.affinity_epsilon,
            affinity_prefix_chars=settings.affinity_prefix_chars,
        )
        caller = EngineCaller(
            pool=self.pool,
            http=self.http,
            metrics=self.metrics,
            worker_id=self.id,
            retries=settings.retries,
            retry_backoff_s=settings.retry_backoff_s,
            request_timeout_s=settings.queue.request_timeout_s,
            health_interval_s=settings.health_interval_s,
            poison_after=settings.queue.poison_after,
        )
        self.jobs = JobRunner(self.consumer, caller, self.metrics, self.outage, self.id)
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
        if record.work is None:  # taken, not started yet: JobRunner checks the flag before it starts
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

    # -- the entries it holds -------------------------------------------------

    def _spawn(self, entry: Entry) -> None:
        record = InFlight(entry)
        self.inflight[entry.request_id] = record
        record.task = asyncio.create_task(self._handle(record), name=f"request-{entry.request_id}")
        self.metrics.inflight.set(len(self.inflight))

    async def _handle(self, record: InFlight) -> None:
        """The entry's life is the JobRunner's; the process frees its slot however that ends."""
        try:
            await self.jobs.handle(record, draining=self.draining)
        finally:
            self.inflight.pop(record.entry.request_id, None)
            self.metrics.inflight.set(len(self.inflight))
            self._slot_free.set()

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
