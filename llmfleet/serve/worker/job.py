"""One job's life in the queue, read top to bottom: from the entry taken to the entry acknowledged.

JobRunner.handle takes one entry the worker took or reclaimed (app.py) to its
end; each queue step is one call of the queue's Consumer (consumer.py):

    taken as the drain began              -> HAND BACK (any worker takes it at once)
    malformed                             -> DEAD_LETTER, 500
    BEGIN: done or gone                   -> ACK (answered already, or its record expired)
           dead (past max_attempts)       -> DEAD_LETTER, 502
           cancelled before it started    -> DELIVER 499
           run, past its queue timeout    -> DELIVER 504
           run: the engine call (engine.py), its chunks published as they come (CHUNK):
                the client went away      -> DELIVER 499
                the drain deadline passed -> HAND BACK (the next attempt continues it)
                a newer attempt owns it   -> nothing (fenced)
                engines died serving it   -> DEAD_LETTER, 422 (poison)
                else                      -> DELIVER the result

DELIVER and DEAD_LETTER acknowledge and delete the entry in the same step.
Until then the entry stays pending: a Redis error out of any step (or a kill
-9) leaves it to be taken again after claim_idle_ms, so a job is run at least
once and answered once (DELIVER stores the first result only; streams are
fenced by attempt). Each queue step rides out a Redis outage until the job's
deadline plus DELIVER_GRACE_MS, chunks until the deadline (outage.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from redis.exceptions import RedisError

from llmfleet.serve.queue.consumer import Consumer, Entry, Start
from llmfleet.serve.queue.jobs import Job, Result, error_body, now_ms, usage_tokens
from llmfleet.serve.worker.engine import POISON_CODE, EngineCaller
from llmfleet.serve.worker.metrics import WorkerMetrics
from llmfleet.serve.worker.outage import DELIVER_GRACE_MS, RedisOutage

log = logging.getLogger(__name__)

T = TypeVar("T")
OUTCOMES = {1: "answer", 0: "duplicate", -1: "fenced"}


class Fenced(Exception):
    """Another attempt owns the request now (this worker was presumed dead): stop, deliver nothing."""


@dataclass
class InFlight:
    """One entry this worker holds; app.py's cancels and drain stop it through stop_reason and work."""

    entry: Entry
    task: asyncio.Task[None] | None = None
    work: asyncio.Task[Result] | None = None
    job: Job | None = None
    stop_reason: str | None = None  # "client" or "drain"


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


async def with_redis(outage: RedisOutage, job: Job, step: Callable[[], Awaitable[T]]) -> T:
    """A queue step of a job, through a Redis outage until the job's deadline plus DELIVER_GRACE_MS."""
    give_up_ms = job.deadline_ms + DELIVER_GRACE_MS
    return await outage.call(f"request {job.id}", step, give_up=lambda: now_ms() > give_up_ms)


@dataclass
class JobRunner:
    """One per worker: takes each entry it is handed through the queue (handle)."""

    consumer: Consumer
    caller: EngineCaller
    metrics: WorkerMetrics
    outage: RedisOutage
    worker_id: str

    async def handle(self, record: InFlight, *, draining: bool) -> None:
        """The entry to its end; whatever goes wrong leaves it pending, to be taken again."""
        entry = record.entry
        try:
            if draining:  # taken as the drain began: give it straight back
                await self.consumer.hand_back([entry])
                self.metrics.handed_back.inc()
                return
            await self._run(record)
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

    async def _run(self, record: InFlight) -> None:
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
        start = await self._step(job, lambda: self.consumer.begin(job.id))
        if start.outcome in ("done", "gone"):
            await self._step(job, lambda: self.consumer.ack(entry))
            return
        if start.outcome == "dead":
            message = f"gave up after {start.attempt - 1} attempts; last: {start.reason}"
            log.error("request %s: %s; dead-lettering it", job.id, message)
            result = Result(
                502, error_body(message, "engine_error", "dead_letter"), attempt=start.attempt, worker=self.worker_id
            )
            await self._dead_letter(entry, job, start.reason, start.attempt - 1, result)
            return
        if start.outcome == "cancelled" or record.stop_reason == "client":
            log.info("request %s: the client went away before it started; not running it", job.id)
            result = Result(499, error_body("the client cancelled the request", "cancelled", "client_closed"))
            await self._deliver(entry, job, start.attempt, result)
            self.metrics.cancelled.inc()
            return
        attempt = start.attempt
        if attempt > 1:
            log.info("request %s: attempt %d (%d characters already streamed)", job.id, attempt, len(start.partial))
        self.metrics.queue_wait.labels(entry.lane).observe(max(now_ms() - job.enqueued_ms, 0) / 1000)
        if past_queue_timeout(job, entry, attempt, now_ms()):
            waited = (now_ms() - job.enqueued_ms) / 1000
            self.metrics.errors.labels("queue_timeout").inc()
            message = f"the request waited {waited:.1f} s in the queue, past its queue timeout"
            result = Result(
                504, error_body(message, "timeout", "queue_timeout"), attempt=attempt, worker=self.worker_id
            )
            await self._deliver(entry, job, attempt, result)
            return

        # The engine call runs as its own task, so that a cancel (app.py: the client went away, or the
        # drain deadline passed) stops the call without stopping this one.
        started = time.monotonic()
        record.work = asyncio.create_task(self._attempt(job, start))
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
            message = "the client went away; the request was cancelled"
            result = Result(
                499, error_body(message, "cancelled", "client_closed"), attempt=attempt, worker=self.worker_id
            )
        except Fenced:
            self.metrics.errors.labels("fenced").inc()
            self.metrics.results.labels("fenced").inc()
            log.warning("request %s: attempt %d lost ownership to a newer attempt; dropping it", job.id, attempt)
            return
        finally:
            self.metrics.engine_time.labels(job.model).observe(time.monotonic() - started)

        if result.status == 422 and (result.body.get("error") or {}).get("code") == POISON_CODE:
            reason = str(result.body["error"].get("message", "poison"))
            log.error("request %s: dead-lettered as poison: %s", job.id, reason)
            await self._dead_letter(entry, job, reason, attempt, result)
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

    async def _attempt(self, job: Job, start: Start) -> Result:
        """The engine call of one attempt; returns once every chunk it streamed is published (else raises)."""
        reporter = AttemptReporter(self.consumer, job, start.attempt, self.outage)
        try:
            result = await self.caller.run(job, start.attempt, start.partial, start.partial_tokens, reporter)
            await reporter.close()
        except BaseException:
            reporter.abort()
            raise
        return result

    async def _step(self, job: Job, step: Callable[[], Awaitable[T]]) -> T:
        return await with_redis(self.outage, job, step)

    async def _deliver(self, entry: Entry, job: Job, attempt: int, result: Result) -> int:
        # Streams are fenced: only the attempt that owns the request may answer (its chunks went out).
        # Before any attempt started (attempt 0: cancelled while queued) there is nothing to fence.
        fenced = job.stream and attempt > 0
        outcome = await self._step(job, lambda: self.consumer.deliver(entry, job, attempt, result, fenced=fenced))
        self.metrics.results.labels(OUTCOMES.get(outcome, "unknown")).inc()
        if outcome == 0:
            log.info("request %s: attempt %d finished after an earlier result; discarded", job.id, attempt)
        self._recorded(job, result, outcome)
        return outcome

    async def _dead_letter(self, entry: Entry, job: Job, reason: str, attempts: int, result: Result) -> None:
        self.metrics.dead_letters.inc()
        outcome = await self._step(job, lambda: self.consumer.dead_letter(entry, job, reason, attempts, result))
        self._recorded(job, result, outcome)

    def _recorded(self, job: Job, result: Result, outcome: int) -> None:
        """Count what DELIVER recorded in the usage records (only the first result of a request is)."""
        if outcome == 1:
            self.metrics.usage_requests.labels(job.model, "answered" if result.ok else "error").inc()


class AttemptReporter:
    """engine.Reporter for one attempt: its chunks published in order (ChunkRelay), engine deaths counted."""

    def __init__(self, consumer: Consumer, job: Job, attempt: int, outage: RedisOutage) -> None:
        self.consumer = consumer
        self.job = job
        # Only a stream has chunks: a plain call starts no relay task.
        self.relay = ChunkRelay(consumer, job, attempt, outage) if job.stream else None

    def chunk(self, data: str, text: str, tokens: int) -> None:
        if self.relay is None:
            raise RuntimeError(f"request {self.job.id} is not streamed: it has no chunks to send")
        self.relay.add(data, text, tokens)

    async def engine_died(self, engine_url: str) -> int | None:
        # No outage retry: a death left uncounted only delays the poison verdict, it loses nothing.
        try:
            return await self.consumer.engine_died(self.job.id, engine_url)
        except RedisError as error:
            log.warning("request %s: could not record the death of engine %s: %s", self.job.id, engine_url, error)
            return None

    async def close(self) -> None:
        if self.relay is not None:
            await self.relay.close()

    def abort(self) -> None:
        if self.relay is not None:
            self.relay.abort()


class ChunkRelay:
    """Publishes chunks in order from a background task, batching what piles up while a call is in flight."""

    def __init__(self, consumer: Consumer, job: Job, attempt: int, outage: RedisOutage) -> None:
        self.consumer = consumer
        self.outage = outage
        self.job = job
        self.attempt = attempt
        self.calls = 0
        self.fenced = False
        self.error: BaseException | None = None
        self.aborted = False
        self._queue: asyncio.Queue[tuple[str, str, int] | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name=f"relay-{job.id}")

    def add(self, data: str, text: str, tokens: int) -> None:
        if self.fenced:
            raise Fenced
        if self.error is not None:
            raise self.error
        self._queue.put_nowait((data, text, tokens))

    async def close(self) -> None:
        """Wait until everything added is published; raise Fenced if it could not be."""
        self._queue.put_nowait(None)
        await self._task
        if self.fenced:
            raise Fenced
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        # The flag as well as the cancel: see worker.app.cancel_and_wait about swallowed cancels.
        self.aborted = True
        self._queue.put_nowait(None)
        self._task.cancel()

    async def _run(self) -> None:
        done = False
        while not done and not self.aborted:
            item = await self._queue.get()
            if item is None:
                return
            batch = [item]
            while not self._queue.empty():
                more = self._queue.get_nowait()
                if more is None:
                    done = True
                    break
                batch.append(more)
            self.calls += 1
            try:
                seq = await self._publish(
                    [data for data, _, _ in batch], "".join(text for _, text, _ in batch), sum(n for _, _, n in batch)
                )
            except RedisError as error:
                self.error = error
                return
            if seq < 0:
                self.fenced = True
                return

    async def _publish(self, chunks: list[str], text: str, tokens: int) -> int:
        """CHUNK, through a Redis outage until the job's deadline (the stream is no use after it)."""
        job, calls = self.job, self.calls
        return await self.outage.call(
            f"request {job.id}: chunks",
            lambda: self.consumer.chunk(job, self.attempt, calls, text, tokens, chunks),
            give_up=lambda: now_ms() > job.deadline_ms,
        )
