"""The gateway's side of the queue: admit, cancel, look up, and receive replies.

Each gateway process has its own reply stream (keys.reply(gateway_id)) and one
reader task that blocks on it and hands each event to the waiter registered
for that request id. Workers add chunks and the final result to it; the result
is also stored under keys.result(id), so a waiter that missed the stream (a
trimmed stream, a Redis restart) still finds its answer by polling the key.

The stored result outlives its delivery only briefly: once a waiter has
handed a sync or stream answer to its client, the reader's next trim (one
pipeline a second for the whole process, not a round trip per request)
shortens the result's and the job record's TTL to delivered_grace_s
(ReplyListener.expire_later). Task-mode results, answers kept for an
Idempotency-Key retry, and answers no waiter took (a gateway that died) keep
result_ttl_s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from llmfleet.serve.queue.config import QueueSettings
from llmfleet.serve.queue.jobs import Job, ReplyEvent, Result, now_ms
from llmfleet.serve.queue.keys import GROUP, Keys
from llmfleet.serve.queue.scripts import Scripts
from llmfleet.serve.queue.usage import SPEND_DAY_TTL_S, SPEND_MONTH_TTL_S, BudgetRefusal, spend_keys

log = logging.getLogger(__name__)

# Reply entries a gateway has read stay this long before they are trimmed.
KEEP_READ_MS = 30_000


@dataclass(frozen=True)
class Limit:
    """One rate limit to check at admission: `limit` per `window_ms`, this request costing `cost`."""

    scope: Literal["subject", "tenant"]
    unit: Literal["requests", "tokens"]
    key: str
    limit: int
    cost: int
    window_ms: int = 60_000


@dataclass(frozen=True)
class LimitState:
    limit: Limit
    remaining: int
    reset_ms: int


@dataclass(frozen=True)
class Admission:
    outcome: Literal["admitted", "rate_limited", "queue_full", "replay", "over_budget"]
    depth: int = 0
    # rate_limited: the limit that refused, None for the concurrency cap.
    refused_by: Limit | None = None
    retry_after_ms: int = 0
    limits: tuple[LimitState, ...] = ()
    # replay: the record the Idempotency-Key already stood for (nothing was queued or charged).
    replay: str = ""
    # over_budget: the token budget that refused it.
    budget: BudgetRefusal | None = None


async def ensure_groups(client: aioredis.Redis, keys: Keys, lanes: tuple[str, ...], models: Iterable[str]) -> None:
    """Create each model's lane streams and their consumer group (idempotent).

    The group starts at 0, so entries queued before the first worker ever ran
    are delivered too.
    """
    for model in models:
        for lane in lanes:
            try:
                await client.xgroup_create(keys.lane(lane, model), GROUP, id="0", mkstream=True)
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    raise


class Producer:
    def __init__(self, client: aioredis.Redis, settings: QueueSettings, gateway_id: str) -> None:
        self.client = client
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.scripts = Scripts.register(client)
        self.gateway_id = gateway_id
        self.reply_key = self.keys.reply(gateway_id)

    async def ensure_groups(self, models: Iterable[str]) -> None:
        await ensure_groups(self.client, self.keys, self.settings.lanes, models)

    async def admit(
        self,
        job: Job,
        *,
        mode: Literal["sync", "task"],
        limits: tuple[Limit, ...],
        concurrency_cap: int,
        lease_ms: int,
        idempotency: tuple[str, str] | None = None,
        tier: str = "",
        cost: int = 0,
    ) -> Admission:
        """Check depth, budgets, limits and the concurrency cap, and queue the job: one atomic step.

        Budgets (usage.py): the subject's, else its tier's, read from Redis in the same step; cost (the
        request's estimated tokens) is held against them until the answer.

        The depth cap is the job's lane's (QueueSettings.depth_cap), counted over the job's model's lanes:
        lower lanes leave headroom for higher ones, and one model's backlog does not refuse another's.

        idempotency: (the key's Redis key, the record to store under it once admitted). A key that already
        stands for a request answers "replay" with its record, and queues and charges nothing.
        """
        lanes = self.settings.lanes
        keys = [
            self.keys.lane(job.lane, job.model),
            self.keys.job(job.id),
            self.keys.concurrency(job.subject),
            *(self.keys.lane(lane, job.model) for lane in lanes),
            *(limit.key for limit in limits),
            self.keys.budgets,
            *spend_keys(self.keys, job.subject, job.enqueued_ms),
            *([idempotency[0]] if idempotency else []),
        ]
        ttl_s = int(max(job.deadline_ms - job.enqueued_ms, 0) / 1000) + self.settings.result_ttl_s
        args: list[Any] = [
            self.settings.depth_cap(job.lane),
            len(lanes),
            job.id,
            job.to_json(),
            ttl_s,
            job.subject,
            mode,
            concurrency_cap,
            lease_ms,
            len(limits),
        ]
        for limit in limits:
            args += [limit.limit, limit.cost, limit.window_ms]
        args += [tier, cost, SPEND_DAY_TTL_S, SPEND_MONTH_TTL_S]
        if idempotency:
            args.append(idempotency[1])
        reply: list[Any] = await self.scripts.admit(keys=keys, args=args)
        status = int(reply[0])
        if status == 6:
            refusal = BudgetRefusal(
                period="monthly" if str(reply[1]) == "monthly" else "daily",
                scope="tier" if str(reply[2]) == "tier" else "sub",
                name=tier if str(reply[2]) == "tier" else job.subject,
                budget=int(reply[3]),
                spent=int(reply[4]),
                cost=cost,
            )
            return Admission("over_budget", budget=refusal)
        if status == 5:
            return Admission("replay", replay=str(reply[1]))
        if status == 4:
            return Admission("admitted", depth=0, limits=())
        if status == 3:
            return Admission("queue_full", depth=int(reply[1]))
        if status == 1:
            return Admission("admitted", depth=int(reply[1]), limits=_states(limits, reply[2:]))
        which = int(reply[1])
        return Admission(
            "rate_limited",
            refused_by=limits[which - 1] if which > 0 else None,
            retry_after_ms=int(reply[2]),
            limits=_states(limits, reply[3:]),
        )

    async def cancel(self, request_id: str, subject: str) -> None:
        """Mark a request cancelled (checked before it starts) and tell the workers (stops it if running)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.cancel(request_id), "1", ex=self.settings.result_ttl_s)
            pipe.publish(self.keys.cancel_channel, request_id)
            pipe.zrem(self.keys.concurrency(subject), request_id)
            await pipe.execute()

    async def result(self, request_id: str) -> Result | None:
        text = await self.client.get(self.keys.result(request_id))
        return Result.from_json(str(text)) if text else None

    async def poll(self, request_id: str) -> Result | Literal["pending", "lost"]:
        """The stored result, else whether the request still exists: one round trip (GET and EXISTS, pipelined).

        "lost": neither a result nor the job record, which ADMIT writes in the same step as the queue entry and
        DELIVER keeps (it only sets its TTL, in the same step as the result). Before the request's deadline that
        happens only when Redis lost writes (restarted without them, or a failover). GET runs first, so a result
        written between the two commands shows as "pending" (the job is still there), never as "lost".
        """
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.result(request_id))
            pipe.exists(self.keys.job(request_id))
            text, exists = await pipe.execute()
        if text:
            return Result.from_json(str(text))
        return "pending" if int(exists) else "lost"

    def delivered_keys(self, request_id: str) -> list[str]:
        """The keys whose TTL a delivered answer shortens to delivered_grace_s."""
        return [self.keys.result(request_id), self.keys.job(request_id)]

    async def job_state(self, request_id: str) -> dict[str, str]:
        state = await self.client.hgetall(self.keys.job(request_id))
        return {str(key): str(value) for key, value in state.items()}

    async def depth(self, model: str) -> dict[str, int]:
        """lane -> entries in one model's stream of that lane."""
        async with self.client.pipeline(transaction=False) as pipe:
            for lane in self.settings.lanes:
                pipe.xlen(self.keys.lane(lane, model))
            lengths = await pipe.execute()
        return dict(zip(self.settings.lanes, (int(n) for n in lengths), strict=True))


def _states(limits: tuple[Limit, ...], values: list[int]) -> tuple[LimitState, ...]:
    return tuple(
        LimitState(limit, remaining=int(values[2 * i]), reset_ms=int(values[2 * i + 1]))
        for i, limit in enumerate(limits)
    )


@dataclass
class Waiter:
    """Events for one request, in stream order."""

    request_id: str
    expires_ms: int
    events: asyncio.Queue[ReplyEvent] = field(default_factory=asyncio.Queue)
    # Set by the listener when its notifications may have been lost: check the stored result now.
    check_now: asyncio.Event = field(default_factory=asyncio.Event)


class ReplyListener:
    """Reads this gateway process's reply stream and dispatches events to waiters."""

    def __init__(self, client: aioredis.Redis, key: str, *, block_ms: int = 2000, keep_s: int = 86_400) -> None:
        # client must tolerate a blocking read of block_ms (see RedisSettings.client).
        self.client = client
        self.key = key
        self.block_ms = block_ms
        self.keep_s = keep_s
        self.waiters: dict[str, Waiter] = {}
        # Keys to EXPIRE, with their TTL, in the next trim's pipeline (expire_later).
        self._expire: list[tuple[str, int]] = []
        self.last_id = "0-0"
        self.connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def register(self, request_id: str, expires_ms: int) -> Waiter:
        """Start collecting events for request_id (before it is queued, so none is missed).

        Waiters are unregistered when their request ends; one left behind (a
        stream whose response never started) is dropped after expires_ms.
        """
        waiter = Waiter(request_id, expires_ms)
        self.waiters[request_id] = waiter
        return waiter

    def unregister(self, request_id: str) -> None:
        self.waiters.pop(request_id, None)

    def expire_later(self, keys: list[str], ttl_s: int) -> None:
        """Set these keys' TTL in the next trim (within about a second): no round trip of its own.

        Used for answers already delivered, whose stored copy is then only kept a grace period.
        """
        self._expire.extend((key, ttl_s) for key in keys)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="reply-listener")

    async def stop(self) -> None:
        # A flag as well as the cancel, and a bounded wait: on Python 3.11 a
        # cancel can be swallowed inside redis-py (asyncio.wait_for's race).
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({self._task}, timeout=self.block_ms / 1000 + 2)

    async def _run(self) -> None:
        backoff = 0.05
        last_trim = 0.0
        loop = asyncio.get_running_loop()
        had_error = False
        while not self._stopping:
            try:
                if had_error:
                    await self._check_continuity()
                    had_error = False
                    # Events written while we could not read may be gone (a Redis restart): every waiter looks
                    # at its stored result now instead of at its next, backed-off poll.
                    for waiter in self.waiters.values():
                        waiter.check_now.set()
                response = await self.client.xread({self.key: self.last_id}, count=1000, block=self.block_ms)
                self.connected.set()
                backoff = 0.05
                for _stream, entries in stream_rows(response):
                    for entry_id, fields in entries:
                        self.last_id = entry_id
                        self._dispatch(fields)
                if loop.time() - last_trim > 1.0:
                    last_trim = loop.time()
                    await self._trim()
            except asyncio.CancelledError:
                raise
            except RedisError as error:
                self.connected.clear()
                had_error = True
                log.warning("reply stream %s: %s; retrying in %.2f s", self.key, error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _dispatch(self, fields: dict[str, str]) -> None:
        try:
            event = ReplyEvent.from_fields(fields)
        except (KeyError, ValueError) as error:
            log.warning("ignoring a malformed reply entry on %s: %s", self.key, error)
            return
        waiter = self.waiters.get(event.request_id)
        if waiter is not None:
            waiter.events.put_nowait(event)

    async def _trim(self) -> None:
        """Drop what was read (MINID), expired waiters, and keep the stream from outliving this process long."""
        now = now_ms()
        for request_id in [rid for rid, waiter in self.waiters.items() if waiter.expires_ms < now]:
            del self.waiters[request_id]
        # Keep what was read in the last KEEP_READ_MS (for debugging, and for a tap following the stream).
        threshold = min(_id_tuple(self.last_id), (now - KEEP_READ_MS, 0))
        expire, self._expire = self._expire, []
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.xtrim(self.key, minid=f"{threshold[0]}-{threshold[1]}", approximate=True)
                pipe.expire(self.key, self.keep_s)
                for key, ttl_s in expire:
                    # LT: only ever shortens (a kept answer's longer TTL is never what this sets).
                    pipe.expire(key, ttl_s, lt=True)
                await pipe.execute()
        except BaseException:
            # Tried again at the next trim; a key that expires meanwhile only ages sooner.
            self._expire = expire + self._expire
            raise

    async def _check_continuity(self) -> None:
        """After Redis came back without our stream's history (no persistence), start over at 0."""
        try:
            info = await self.client.xinfo_stream(self.key)
        except ResponseError:  # no such key yet
            self.last_id = "0-0"
            return
        if _id_tuple(str(info.get("last-generated-id", "0-0"))) < _id_tuple(self.last_id):
            log.warning("reply stream %s restarted below %s; reading it from the start", self.key, self.last_id)
            self.last_id = "0-0"


def stream_rows(response: Any) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """XREAD/XREADGROUP replies (RESP2, as our clients speak it) as [(stream, [(entry id, fields)])]."""
    return [
        (str(stream), [(str(entry_id), dict(fields or {})) for entry_id, fields in entries])
        for stream, entries in response or ()
    ]


def _id_tuple(entry_id: str) -> tuple[int, int]:
    millis, _, seq = entry_id.partition("-")
    return int(millis or 0), int(seq or 0)
