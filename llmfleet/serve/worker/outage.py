"""The worker's one policy for Redis going away, in two layers, both redis-py's own `Retry`.

1. On every client (RedisSettings.client, shared with the gateway): a short
   outage, a dropped connection, a timed-out read or a Redis still loading its
   AOF is retried inside the command: `CLIENT_RETRIES` more tries, with
   exponential backoff (jitter, 0.05 s doubling up to 1 s), on ConnectionError,
   TimeoutError and BusyLoadingError. redis-py retries the connect inside each
   try as well, so a command tries at most (1 + CLIENT_RETRIES)² connections
   (refused ones: about half a second in all). A blip costs a command under a
   second or two, and nothing above it sees the error.
2. Above that, `RedisOutage.call`: for the steps that must not fail while
   Redis restarts (tens of seconds), the same Retry class with no limit on
   tries, equal-jitter exponential backoff (0.05 s doubling up to 2 s; never
   under half the step, so no busy loop, and spread so a fleet of workers does
   not reconnect in lockstep), on `OUTAGE_ERRORS` only: Redis unreachable, or
   refusing writes while full under noeviction. Each step says when to give up
   instead (a job's deadline, the worker draining); any other Redis error (a
   refused command, a missing consumer group) is not an outage and comes out
   at once.

Where the worker uses layer 2 (app.py, job.py): starting (the consumer
groups and the first report, one step); taking work (until a drain); each
queue step of a job (BEGIN, CHUNK, DELIVER, ACK, dead letters) until its
deadline plus DELIVER_GRACE_MS, so a finished answer is still stored after a
restart; and the cancel channel's subscription. The periodic steps (report,
heartbeat, reclaim) have no retry of their own: the next round is the retry.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

T = TypeVar("T")

# Layer 1, as RedisSettings.client builds it (llmfleet/serve/queue/config.py); the unit tests hold the
# worker's clients to these.
CLIENT_RETRIES = 3
CLIENT_RETRY_ON = (RedisConnectionError, RedisTimeoutError)  # BusyLoadingError is a ConnectionError

# Layer 2. ConnectionError covers BusyLoadingError (a restarted Redis loading its AOF) and
# MaxConnectionsError; OutOfMemoryError is a Redis under noeviction that is full until results expire.
OUTAGE_ERRORS: tuple[type[RedisError], ...] = (RedisConnectionError, RedisTimeoutError, OutOfMemoryError)
OUTAGE_BACKOFF_BASE_S = 0.05
OUTAGE_BACKOFF_CAP_S = 2.0

# How long past a job's deadline its result may still be stored: the gateway waits 5 s past it, and a
# task's answer is read later still.
DELIVER_GRACE_MS = 30_000


def outage_retry() -> Retry:
    """Layer 2's Retry: every outage error, without a limit on tries (each call gives up on its own terms)."""
    return Retry(EqualJitterBackoff(cap=OUTAGE_BACKOFF_CAP_S, base=OUTAGE_BACKOFF_BASE_S), -1, OUTAGE_ERRORS)


@dataclass
class RedisOutage:
    """Runs a step through a Redis outage; `down` is called on each failure (the worker's /readyz)."""

    down: Callable[[], None] = lambda: None
    retry: Retry = field(default_factory=outage_retry)

    async def call(self, what: str, step: Callable[[], Awaitable[T]], *, give_up: Callable[[], bool]) -> T:
        """step(), retried on OUTAGE_ERRORS until it succeeds or give_up() is true (then its error comes out)."""

        failed_tries = 0

        async def failed(error: Exception, failures: int) -> None:
            nonlocal failed_tries
            failed_tries = failures
            self.down()
            if give_up():
                raise error
            if failures == 1:
                log.warning("%s: redis: %s; retrying until it is back", what, error)
            else:
                log.debug("%s: redis: %s (failure %d)", what, error, failures)

        value = await self.retry.call_with_retry(step, failed, with_failure_count=True)
        if failed_tries:
            log.info("%s: redis is back after %d failed tries", what, failed_tries)
        return value
