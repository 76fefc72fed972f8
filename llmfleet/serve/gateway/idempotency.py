"""Idempotency-Key: a client's retry of a POST gets the first request's answer, never a second run.

A client that lost its connection cannot tell whether its request ran. Sent
with the same `Idempotency-Key` header (any 1 to 255 visible ASCII
characters, per token subject), the retry of the same request within the
answer's retention gets:

- the first request's answer, once it has one (a stream gets it as server-sent
  events, a task its 202 again), with `Idempotent-Replayed: true`;
- while the first still runs: a sync retry waits for its answer, a stream
  retry waits with SSE keep-alive comments (stream_keepalive_s) and then
  gets the whole answer;
- with a different body, model, mode or stream flag: 422
  `idempotency_key_reused` (a new request needs a new key).

A request with a key is not cancelled when its client goes away (the retry
will want its answer); its deadline still ends it. The key is recorded in the
same atomic step that queues the request (the ADMIT script), so two retries
racing each other still queue it once, and a refused request (rate limit,
full queue) leaves the key unused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from redis.exceptions import RedisError

from llmfleet.serve.gateway.deps import AppState
from llmfleet.serve.gateway.errors import APIError, shaped
from llmfleet.serve.gateway.routes.tasks import LOST_RETRY_AFTER_S, lost_result, task_status
from llmfleet.serve.gateway.sse import HEADERS, KEEPALIVE, Sent, final_events
from llmfleet.serve.queue.jobs import Job, Result, error_body, now_ms

HEADER = "Idempotency-Key"
PATTERN = r"^[!-~]{1,255}$"
DESCRIPTION = (
    "Any 1 to 255 visible ASCII characters. A retry with the same key and request within the answer's retention "
    "gets the first request's answer instead of running again (`Idempotent-Replayed: true`); the same key with "
    "another request is refused (422)."
)
REPLAYED = {"Idempotent-Replayed": "true"}


@dataclass(frozen=True)
class Record:
    """What a key stands for: the request it admitted and a digest of what was asked."""

    id: str
    fingerprint: str
    enqueued_ms: int
    deadline_ms: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Record:
        data = json.loads(text)
        return cls(str(data["id"]), str(data["fingerprint"]), int(data["enqueued_ms"]), int(data["deadline_ms"]))

    @classmethod
    def of(cls, job: Job, task: bool) -> Record:
        # The engine payload as checked (defaults filled in), so two spellings of one request agree.
        asked = {"kind": job.kind, "model": job.model, "payload": job.payload, "stream": job.stream, "task": task}
        digest = hashlib.sha256(json.dumps(asked, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        return cls(job.id, digest, job.enqueued_ms, job.deadline_ms)


def reused(key: str) -> APIError:
    message = (
        f"Idempotency-Key {key!r} already stands for a different request (body, model, stream or "
        "Prefer: respond-async); send a new key with a new request"
    )
    return APIError(422, message, code="idempotency_key_reused", param=HEADER)


async def replay(
    state: AppState,
    job: Job,
    first: Record,
    request: Request,
    include_usage: bool,
    task: bool,
    grace_ms: int,
) -> Response:
    """The answer of the request `first` stands for, given to its retry `job` (already checked to be the same).

    grace_ms: how long past the first request's deadline its answer is still awaited (as for the first request).
    """
    deadline_ms = first.deadline_ms + grace_ms
    original = dataclasses.replace(job, id=first.id, enqueued_ms=first.enqueued_ms, deadline_ms=deadline_ms)
    # x-request-id stays this HTTP request's own (the RequestId middleware sets it); the body carries first.id.
    headers = dict(REPLAYED)
    if task:
        url = f"/v1/tasks/{first.id}"
        status = await task_status(first.id, job.subject, state)
        body = {"id": first.id, "object": "task", "status": status.status, "url": url}
        return JSONResponse(body, status_code=202, headers={**headers, "Location": url})
    if job.stream:
        return StreamingResponse(
            _replayed_stream(state, original, include_usage),
            media_type="text/event-stream",
            headers={**headers, **HEADERS},
        )
    result = await _result(state, original, request)
    if result is None:
        return Response(status_code=499)
    if result.status == 503 and (result.body.get("error") or {}).get("code") == "request_lost":
        headers["Retry-After"] = str(LOST_RETRY_AFTER_S)
    body = shaped(request.url.path, result.status, result.body)
    return JSONResponse(body, status_code=result.status, headers=headers)


def _deadline_result() -> Result:
    body = error_body("no answer before the first request's deadline", "timeout", "deadline_exceeded")
    return Result(504, body)


async def _result(state: AppState, job: Job, request: Request | None) -> Result | None:
    """The stored answer of job, polled until its deadline (grace included); None if the client went away first.

    A job Redis lost (Producer.poll: no result, no job record) answers 503 request_lost at once.
    """
    while True:
        try:
            polled = await state.producer.poll(job.id)
        except RedisError:
            polled = "pending"
        if polled == "lost":
            state.metrics.lost.labels("replay").inc()
            return lost_result()
        if isinstance(polled, Result):
            return polled
        remaining_s = (job.deadline_ms - now_ms()) / 1000
        if remaining_s <= 0:
            return _deadline_result()
        if request is not None and await request.is_disconnected():
            return None
        await asyncio.sleep(min(state.settings.result_poll_s, remaining_s))


async def _replayed_stream(state: AppState, job: Job, include_usage: bool) -> AsyncGenerator[bytes, None]:
    """The whole answer as server-sent events, with keep-alive comments while it is still being made."""
    waiting = asyncio.ensure_future(_result(state, job, None))
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=state.settings.stream_keepalive_s)
            if done:
                break
            yield KEEPALIVE
        result = waiting.result()
        assert result is not None  # without a request to watch, only the deadline ends the wait
        sent: dict[int, Sent] = {}
        for data in final_events(job, sent, result, include_usage):
            yield data
    finally:
        waiting.cancel()
