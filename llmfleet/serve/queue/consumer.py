"""The worker's side of the queue: take, reclaim, begin, stream chunks, deliver, hand back.

The life of one entry (see scripts.py for each step's atomicity):

    TAKE / XREADGROUP / XAUTOCLAIM -> BEGIN -> [CHUNK ...] -> DELIVER
                                         \\-> DEAD_LETTER past max_attempts

While a worker holds an entry it TOUCHes it every claim_idle/3 so that it never
looks idle; a worker that dies stops touching, and after claim_idle_ms another
worker's XAUTOCLAIM takes the entry over and BEGINs a new attempt.

Each model has its own lanes (Keys.lane). A consumer reads only the models it
follows (the worker's admitted engines serve them: follow()), so a job for a
model none of this worker's engines serves stays queued, in its place, for a
worker that can run it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis.asyncio as aioredis

from llmfleet.serve.queue.config import QueueSettings
from llmfleet.serve.queue.jobs import Job, Result, now_ms, usage_tokens
from llmfleet.serve.queue.keys import GROUP, LEGACY_MODEL, Keys
from llmfleet.serve.queue.lanes import fair_turns
from llmfleet.serve.queue.producer import ensure_groups, stream_rows
from llmfleet.serve.queue.scripts import Scripts
from llmfleet.serve.queue.usage import SPEND_DAY_TTL_S, SPEND_MONTH_TTL_S, pair_member, spend_keys, utc_day

log = logging.getLogger(__name__)

# The idle time given to an entry handed back: far past any claim_idle_ms, so
# the next XAUTOCLAIM by any worker takes it at once, at its place in the queue.
HAND_BACK_IDLE_MS = 10**12


@dataclass(frozen=True)
class Entry:
    lane: str
    entry_id: str
    fields: dict[str, str]
    reclaimed: bool = False
    # The model whose lane stream holds the entry (Keys.lane).
    model: str = LEGACY_MODEL

    @property
    def request_id(self) -> str:
        return self.fields.get("id") or self.entry_id


@dataclass(frozen=True)
class Backlog:
    """One lane stream's backlog (Consumer.backlog)."""

    length: int  # entries in the stream: waiting + in flight
    pending: int  # in flight: delivered to a worker, not yet acknowledged
    waiting: int  # queued, not yet taken by any worker
    oldest_wait_s: float  # age of the oldest waiting entry; 0 when none waits


@dataclass(frozen=True)
class Start:
    """What BEGIN decided."""

    outcome: Literal["run", "done", "gone", "cancelled", "dead"]
    attempt: int = 0
    partial: str = ""
    partial_tokens: int = 0
    reason: str = ""


class Consumer:
    def __init__(
        self,
        client: aioredis.Redis,
        blocking: aioredis.Redis,
        settings: QueueSettings,
        worker_id: str,
        *,
        record_usage: bool = True,
    ) -> None:
        self.client = client
        self.blocking = blocking
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.scripts = Scripts.register(client)
        self.worker_id = worker_id
        # False only for the baseline of `llmfleet bench usage` (llmfleet/bench/usagecost.py), which measures
        # what the usage records cost: the worker always records.
        self.record_usage = record_usage
        self._cursors: dict[str, str] = {}
        # Entries this consumer has taken (take and wait_take): numbers the fair turns (lanes.fair_turns).
        self.taken = 0
        # The models whose lanes it reads (follow), the legacy lanes while they exist (check_legacy),
        # and every model whose groups it has made sure of (their depth is reported even when no
        # engine of this worker serves them for a while).
        self.models: tuple[str, ...] = ()
        self.legacy = False
        self.known: set[str] = set()
        # Which followed model's stream a take reads first, in turn: one model's backlog cannot
        # take every free slot each time.
        self._first = 0

    async def follow(self, models: Iterable[str]) -> None:
        """Read the lanes of these models from now on, making sure of the groups of those new here."""
        wanted = tuple(sorted(set(models)))
        new = [model for model in wanted if model not in self.known]
        if new:
            await ensure_groups(self.client, self.keys, self.settings.lanes, new)
            self.known.update(new)
        self.models = wanted

    async def check_legacy(self) -> bool:
        """Whether the lanes every model shared before (Keys.lane) exist; while they do, they are read too."""
        async with self.client.pipeline(transaction=False) as pipe:
            for lane in self.settings.lanes:
                pipe.exists(self.keys.lane(lane, LEGACY_MODEL))
            found = any(await pipe.execute())
        if found and not self.legacy:
            # An older gateway made them with their group; a lane it never used may lack one.
            await ensure_groups(self.client, self.keys, self.settings.lanes, [LEGACY_MODEL])
            log.info("reading the lanes queued by an older gateway (%s:q:<lane>) too", self.keys.prefix)
        self.legacy = found
        return found

    async def ensure_groups(self) -> None:
        """Make the groups of every model this consumer knows again (Redis lost its data)."""
        await ensure_groups(self.client, self.keys, self.settings.lanes, [*self.known, *self._legacy()])

    def _legacy(self) -> tuple[str, ...]:
        """The lanes every model shared before, while they exist (check_legacy)."""
        return (LEGACY_MODEL,) if self.legacy else ()

    def _reading(self) -> tuple[str, ...]:
        return self.models + self._legacy()

    def _stream_keys(self, models: tuple[str, ...]) -> list[str]:
        """Lane by lane, highest first; within a lane, one stream per model."""
        return [self.keys.lane(lane, model) for lane in self.settings.lanes for model in models]

    async def take(self, count: int) -> list[Entry]:
        """Up to count new entries of the followed models, highest lane first but for the fair turns.

        Within a lane the models' streams are read in turn, starting with a different one each call.
        """
        models = self._reading()
        if not models or count <= 0:
            return []
        lanes = len(self.settings.lanes)
        turns = fair_turns(self.taken, count, self.settings.lower_lane_every, lanes)
        self._first = (self._first + 1) % len(models)
        args: list[Any] = [GROUP, self.worker_id, count, len(models), self._first, len(turns), lanes - 1]
        for turn in turns:
            args += [index + 1 for index in turn]
        rows: list[list[Any]] = await self.scripts.take(keys=self._stream_keys(models), args=args)
        entries = []
        for lane_index, model_index, entry_id, flat in rows:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            lane, model = self.settings.lanes[int(lane_index) - 1], models[int(model_index) - 1]
            entries.append(Entry(lane, entry_id, fields, model=model))
        self.taken += len(entries)
        return entries

    async def wait_take(self, count: int, block_ms: int) -> list[Entry]:
        """Block up to block_ms for new entries on any followed lane (used only when all were empty)."""
        models = self._reading()
        if not models:
            return []
        where = {self.keys.lane(lane, model): (lane, model) for lane in self.settings.lanes for model in models}
        streams: dict[Any, Any] = dict.fromkeys(where, ">")
        response = await self.blocking.xreadgroup(GROUP, self.worker_id, streams, count=count, block=block_ms)
        entries = []
        for stream, rows in stream_rows(response):
            lane, model = where[stream]
            for entry_id, fields in rows:
                if fields:  # None/empty for an entry deleted while pending
                    entries.append(Entry(lane, entry_id, fields, model=model))
        self.taken += len(entries)
        return entries

    async def reclaim(self, count: int) -> list[Entry]:
        """Take over up to count entries of the followed models idle past claim_idle_ms (their worker is gone)."""
        entries: list[Entry] = []
        for lane in self.settings.lanes:
            for model in self._reading():
                if len(entries) >= count:
                    return entries
                stream = self.keys.lane(lane, model)
                response = await self.client.xautoclaim(
                    stream,
                    GROUP,
                    self.worker_id,
                    min_idle_time=self.settings.claim_idle_ms,
                    start_id=self._cursors.get(stream, "0-0"),
                    count=count - len(entries),
                )
                self._cursors[stream] = response[0]
                for entry_id, fields in response[1]:
                    if fields:
                        entries.append(Entry(lane, entry_id, fields, reclaimed=True, model=model))
        return entries

    async def begin(self, request_id: str) -> Start:
        keys = [
            self.keys.job(request_id),
            self.keys.result(request_id),
            self.keys.cancel(request_id),
            self.keys.partial(request_id),
        ]
        reply: list[Any] = await self.scripts.begin(keys=keys, args=[self.settings.max_attempts, self.worker_id])
        outcome = reply[0]
        if outcome == "run":
            return Start("run", attempt=int(reply[1]), partial=str(reply[2]), partial_tokens=int(reply[3]))
        if outcome == "dead":
            return Start("dead", attempt=int(reply[1]), reason=str(reply[2]))
        if outcome in ("done", "gone", "cancelled"):
            return Start(outcome)
        raise ValueError(f"BEGIN returned {reply!r}")

    async def chunk(self, job: Job, attempt: int, call: int, text: str, tokens: int, chunks: list[str]) -> int:
        """Publish streamed chunks (only while this attempt owns the request).

        call numbers this attempt's chunk calls from 1, so that a call retried
        after a lost reply is applied once. Returns the seq (0: applied before)
        or -1 when another attempt owns the request now.
        """
        keys = [self.keys.job(job.id), self.keys.partial(job.id), job.reply]
        args: list[Any] = [
            attempt,
            job.id,
            text,
            tokens,
            "[" + ",".join(chunks) + "]",
            self.settings.reply_maxlen,
            self._ttl_s(job),
            f"{attempt}:{call}",
        ]
        seq: int = await self.scripts.chunk(keys=keys, args=args)
        return int(seq)

    def _ttl_s(self, job: Job) -> int:
        return int(max(job.deadline_ms - job.enqueued_ms, 0) / 1000) + self.settings.result_ttl_s

    def _deliver_args(
        self, entry: Entry, job: Job | None, request_id: str, attempt: int, result: Result, fenced: bool
    ) -> tuple[list[str], list[Any]]:
        """DELIVER's keys and arguments; a known job's usage is recorded with its first result (usage.py)."""
        subject = job.subject if job else ""
        reply = job.reply if job else ""
        # The day of admission, as the gateway charged the job's estimate to it.
        when_ms = job.enqueued_ms if job else now_ms()
        model = job.model if job else ""
        record = job is not None and self.record_usage
        prompt, completion = usage_tokens(result.body) if record and result.ok else (0, 0)
        keys = [
            self.keys.result(request_id),
            self.keys.job(request_id),
            reply or self.keys.reply("none"),
            self.keys.lane(entry.lane, entry.model),
            self.keys.concurrency(subject),
            self.keys.partial(request_id),
            self.keys.usage(utc_day(when_ms), subject, model),
            self.keys.usage_index(utc_day(when_ms)),
            *spend_keys(self.keys, subject, when_ms),
        ]
        args: list[Any] = [
            result.to_json(),
            self.settings.result_ttl_s,
            GROUP,
            entry.entry_id,
            request_id,
            attempt,
            "1" if fenced else "0",
            self.settings.reply_maxlen,
            result.status,
            "1" if reply else "0",
            "1" if record else "0",
            pair_member(subject, model),
            prompt,
            completion,
            self.settings.usage_retention_days * 86_400,
            SPEND_DAY_TTL_S,
            SPEND_MONTH_TTL_S,
        ]
        return keys, args

    async def deliver(self, entry: Entry, job: Job, attempt: int, result: Result, *, fenced: bool) -> int:
        """1: this result is the answer; 0: an earlier one was (a duplicate); -1: fenced off."""
        keys, args = self._deliver_args(entry, job, job.id, attempt, result, fenced)
        outcome: int = await self.scripts.deliver(keys=keys, args=args)
        return int(outcome)

    async def dead_letter(self, entry: Entry, job: Job | None, reason: str, attempts: int, result: Result) -> int:
        request_id = job.id if job else entry.request_id
        keys, args = self._deliver_args(entry, job, request_id, attempts, result, fenced=False)
        keys.append(self.keys.dead_letter)
        job_json = entry.fields.get("job") or json.dumps(entry.fields)
        args += [reason, attempts, job_json, self.settings.dead_letter_maxlen, entry.lane]
        outcome: int = await self.scripts.dead_letter(keys=keys, args=args)
        return int(outcome)

    async def engine_died(self, request_id: str, engine_url: str) -> int:
        """Record that an engine died while serving this request; how many have so far (across attempts)."""
        key = self.keys.job(request_id)
        # No MULTI: the worker's ACL (roles/redis) grants only the commands it runs; the count is one HINCRBY.
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, "engine_deaths", 1)
            pipe.hset(key, "last_error", f"engine {engine_url} died while serving it")
            deaths, _ = await pipe.execute()
        return int(deaths)

    async def ack(self, entry: Entry) -> None:
        """Acknowledge and delete an entry that needs no answer (already answered, or expired)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xack(self.keys.lane(entry.lane, entry.model), GROUP, entry.entry_id)
            pipe.xdel(self.keys.lane(entry.lane, entry.model), entry.entry_id)
            await pipe.execute()

    async def cancelled(self, request_ids: list[str]) -> set[str]:
        """Which of these requests their client cancelled (a lost PUBLISH is caught here)."""
        if not request_ids:
            return set()
        async with self.client.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.exists(self.keys.cancel(request_id))
            flags = await pipe.execute()
        return {request_id for request_id, flag in zip(request_ids, flags, strict=True) if flag}

    async def touch(self, entries: Iterable[Entry], *, idle_ms: int = 0) -> int:
        """Reset (or, with a large idle_ms, hand back) the idle time of entries this worker still holds."""
        by_stream: dict[str, list[str]] = {}
        for entry in entries:
            by_stream.setdefault(self.keys.lane(entry.lane, entry.model), []).append(entry.entry_id)
        touched = 0
        for stream, ids in by_stream.items():
            count: int = await self.scripts.touch(keys=[stream], args=[GROUP, self.worker_id, idle_ms, *ids])
            touched += int(count)
        return touched

    async def hand_back(self, entries: list[Entry], started: Iterable[str] = ()) -> int:
        """Give entries back for any worker to take at once (graceful drain).

        Requests this worker had started go back to state "queued", so the next
        attempt does not record them as lost.
        """
        if not entries:
            return 0
        started_ids = set(started)
        async with self.client.pipeline(transaction=False) as pipe:
            for entry in entries:
                if entry.request_id in started_ids:
                    pipe.hset(self.keys.job(entry.request_id), "state", "queued")
            await pipe.execute()
        return await self.touch(entries, idle_ms=HAND_BACK_IDLE_MS)

    async def backlog(self) -> dict[tuple[str, str], Backlog]:
        """(lane, model) -> the lane's backlog, each figure read in one step, for the metrics and the alerts.

        For every model this consumer knows, followed now or not, and the legacy lanes while they exist.
        Entries leave the stream when delivered (DELIVER's XDEL), so the stream holds what waits and what
        is in flight; the group's PEL holds what is in flight. The oldest waiting entry is the first after
        the group's last delivered id; its id is its admission time in Redis's clock, compared with TIME
        from the same server, so the workers' clocks do not matter.
        """
        streams = self._streams()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.time()
            for lane, model in streams:
                key = self.keys.lane(lane, model)
                pipe.xlen(key)
                pipe.xpending(key, GROUP)
                pipe.xinfo_groups(key)
            values = await pipe.execute()
        seconds, micros = values[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        out: dict[tuple[str, str], Backlog] = {}
        after: dict[tuple[str, str], str] = {}
        for index, stream in enumerate(streams):
            length, pending, groups = values[1 + 3 * index : 4 + 3 * index]
            in_flight = int(pending.get("pending", 0)) if isinstance(pending, dict) else 0
            waiting = max(int(length) - in_flight, 0)
            out[stream] = Backlog(int(length), in_flight, waiting, 0.0)
            group = next((found for found in groups if found.get("name") == GROUP), None)
            if waiting and group is not None:
                after[stream] = str(group.get("last-delivered-id") or "0-0")
        if after:
            async with self.client.pipeline(transaction=False) as pipe:
                for (lane, model), last in after.items():
                    pipe.xrange(self.keys.lane(lane, model), min=f"({last}", max="+", count=1)
                firsts = await pipe.execute()
            for stream, rows in zip(after, firsts, strict=True):
                if rows:
                    admitted_ms = int(str(rows[0][0]).split("-", 1)[0])
                    out[stream] = replace(out[stream], oldest_wait_s=max(now_ms - admitted_ms, 0) / 1000)
        return out

    def _streams(self) -> list[tuple[str, str]]:
        return [(lane, model) for model in (*sorted(self.known), *self._legacy()) for lane in self.settings.lanes]
