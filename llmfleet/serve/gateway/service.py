"""Submitting a completion: check, admit, queue; then wait for the answer, relay the stream, or hand out a task id.

Three modes:
- sync: the client waits; the answer comes on this process's reply stream
  (and is also stored, so a lost notification is found by polling the key);
- stream (`"stream": true`): once admitted, the client gets the SSE headers
  at once and keep-alive comments while the request waits; chunks are relayed
  in order (seq numbers, see sse.Sequencer for a gap), an answer that comes
  whole is converted to chunks, an error becomes a `data: {"error": ...}`
  event; the stream always ends with `data: [DONE]`;
- task (`Prefer: respond-async`): 202 with an id at once; GET /v1/tasks/{id}.

A client that goes away (or a gateway-side timeout) cancels the request: the
workers stop its engine request, or skip it if it has not started. A request
sent with an Idempotency-Key is the exception: its answer is kept for the
retry (idempotency.py), and only its deadline ends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from redis.exceptions import RedisError
from starlette.types import Receive, Scope, Send

from llmfleet.serve.gateway import ratelimit
from llmfleet.serve.gateway.auth import Principal, forbidden_model
from llmfleet.serve.gateway.deps import AppState
from llmfleet.serve.gateway.errors import APIError, pool_exhausted, queue_error, shaped
from llmfleet.serve.gateway.idempotency import DESCRIPTION as IDEMPOTENCY_DESCRIPTION
from llmfleet.serve.gateway.idempotency import HEADER as IDEMPOTENCY_HEADER
from llmfleet.serve.gateway.idempotency import PATTERN as IDEMPOTENCY_PATTERN
from llmfleet.serve.gateway.idempotency import Record, replay, reused
from llmfleet.serve.gateway.messages_schema import MessagesRequest
from llmfleet.serve.gateway.middleware import request_id
from llmfleet.serve.gateway.responses_schema import ResponsesRequest
from llmfleet.serve.gateway.routes.tasks import ADMITTED, LOST_RETRY_AFTER_S, lost_body
from llmfleet.serve.gateway.schemas import ChatCompletionRequest, CompletionRequest
from llmfleet.serve.gateway.sse import HEADERS, KEEPALIVE, Sent, Sequencer, final_events, frame, stream_error, track
from llmfleet.serve.gateway.validation import Checked, ModelInfo, check_chat, check_completion, check_translated
from llmfleet.serve.queue.jobs import Job, Kind, ReplyEvent, Result, error_body, now_ms
from llmfleet.serve.queue.producer import Waiter

log = logging.getLogger(__name__)

# How long past a job's deadline the gateway still waits for its answer (the
# worker's own deadline handling answers first; this only covers a lost worker).
DEADLINE_GRACE_MS = 5_000

PREFER = "`respond-async`: queue the request and answer 202 with a task id (GET /v1/tasks/{id})"

# A request of any API the gateway queues.
Body = ChatCompletionRequest | CompletionRequest | ResponsesRequest | MessagesRequest


def prefers_async(prefer: str | None) -> bool:
    """RFC 7240: `Prefer: respond-async` asks for 202 and a task instead of waiting."""
    if not prefer:
        return False
    return any(part.strip().lower() == "respond-async" for part in prefer.split(","))


@dataclass(frozen=True)
class Options:
    """The headers any queued request may carry: `Prefer: respond-async` (a task) and `Idempotency-Key`."""

    prefer: str | None
    idempotency_key: str | None


async def submit_options(
    prefer: Annotated[str | None, Header(description=PREFER, max_length=256)] = None,
    idempotency_key: Annotated[
        str | None, Header(alias=IDEMPOTENCY_HEADER, description=IDEMPOTENCY_DESCRIPTION, pattern=IDEMPOTENCY_PATTERN)
    ] = None,
) -> Options:
    return Options(prefer, idempotency_key)


OptionsDep = Annotated[Options, Depends(submit_options)]


def served_model(state: AppState, principal: Principal, name: str) -> ModelInfo:
    """The model a request names, if this gateway serves it and the token may use it (else 403 or 404)."""
    if not principal.may_use(name):
        raise _rejected(state, "forbidden", forbidden_model(name))
    model = state.models.get(name)
    if model is None:
        message = f"model {name!r} is not served here; GET /v1/models lists the models"
        raise _rejected(state, "invalid", APIError(404, message, code="model_not_found", param="model"))
    return model


async def submit(
    kind: Kind,
    body: Body,
    request: Request,
    principal: Principal,
    state: AppState,
    options: Options,
) -> Response:
    prefer, idempotency_key = options.prefer, options.idempotency_key
    settings = state.settings
    metrics = state.metrics
    name = body.model
    model = served_model(state, principal, name)
    task_mode = prefers_async(prefer)
    if task_mode and body.stream:
        message = "a task (Prefer: respond-async) cannot stream; drop one of them"
        raise _rejected(state, "invalid", APIError(400, message, param="stream"))
    try:
        snapshot = await state.registry.snapshot()
    except RedisError as error:
        raise _queue_unavailable(state, error) from None
    live = snapshot.models.get(name)
    if live is None:
        message = f"no healthy engine serves model {name!r} right now"
        unavailable = APIError(503, message, "server_error", "model_unavailable", headers={"Retry-After": "5"})
        raise _rejected(state, "no_engine", unavailable)
    max_model_len = model.max_model_len(live.max_model_len)
    try:
        checked = await _check(body, model, max_model_len, state)
    except APIError as error:
        metrics.rejected.labels("context_length" if error.code == "context_length_exceeded" else "invalid").inc()
        raise
    metrics.prompt_tokens.labels(name).observe(checked.prompt_tokens)

    queue = settings.queue
    now = now_ms()
    job = Job(
        id=request_id(request.scope) or uuid.uuid4().hex,
        kind=kind,
        model=name,
        payload=checked.payload,
        stream=bool(body.stream),
        reply="" if task_mode else state.producer.reply_key,
        subject=principal.subject,
        tenant=principal.tenant,
        lane=principal.lane,
        prompt_tokens=checked.prompt_tokens,
        max_tokens=checked.max_tokens,
        enqueued_ms=now,
        deadline_ms=now + int((queue.queue_timeout_s + queue.request_timeout_s) * 1000),
        queue_deadline_ms=now + int(queue.queue_timeout_s * 1000),
    )
    tier = settings.tiers[principal.tier]
    # Tokens charged: the prompt and every choice's answer (n choices may each use max_tokens).
    cost = checked.prompt_tokens + checked.max_tokens * body.choices
    limits = ratelimit.limits_for(principal, tier, state.producer.keys, cost)
    record = idempotency = None
    if idempotency_key is not None:
        record = Record.of(job, task_mode)
        idempotency = (state.producer.keys.idempotency(principal.subject, idempotency_key), record.to_json())
    waiter = None if task_mode else state.replies.register(job.id, job.deadline_ms + DEADLINE_GRACE_MS)
    try:
        admission = await state.producer.admit(
            job,
            mode="task" if task_mode else "sync",
            limits=limits,
            concurrency_cap=tier.concurrency,
            lease_ms=job.deadline_ms - now + DEADLINE_GRACE_MS,
            idempotency=idempotency,
            tier=principal.tier,
            cost=cost,
        )
    except RedisError as error:
        state.replies.unregister(job.id)
        raise _queue_unavailable(state, error) from None
    except BaseException:
        state.replies.unregister(job.id)
        raise
    # The Responses and Messages APIs have no usage chunk: their streams carry usage in their last events.
    stream_options = body.stream_options if isinstance(body, ChatCompletionRequest | CompletionRequest) else None
    include_usage = bool(stream_options and stream_options.include_usage)
    if admission.outcome == "replay" and record is not None and idempotency_key is not None:
        state.replies.unregister(job.id)
        first = Record.from_json(admission.replay)
        if first.fingerprint != record.fingerprint:
            raise _rejected(state, "invalid", reused(idempotency_key))
        metrics.replayed.labels(name, "task" if task_mode else ("stream" if body.stream else "sync")).inc()
        return await replay(state, job, first, request, include_usage, task_mode, DEADLINE_GRACE_MS)
    if admission.outcome != "admitted":
        state.replies.unregister(job.id)
        if admission.outcome == "queue_full":
            retry = str(queue.backpressure_retry_after_s)
            # Lower lanes stop short of max_depth (lane_reserve): say whose share is full.
            message = f"the queue is full for lane {principal.lane} ({admission.depth} requests); retry after {retry} s"
            full = APIError(503, message, "server_error", "queue_full", headers={"Retry-After": retry})
            raise _rejected(state, "queue_full", full)
        if admission.budget is not None:
            raise _rejected(state, "budget", ratelimit.budget_refusal(admission.budget, now_ms()))
        reason = "concurrency" if admission.refused_by is None else "rate_limit"
        raise _rejected(state, reason, ratelimit.refusal(admission, tier))

    mode = "task" if task_mode else ("stream" if body.stream else "sync")
    metrics.admitted.labels(name, principal.lane, mode).inc()
    headers = {"x-request-id": job.id, **ratelimit.headers(admission.limits)}
    if checked.truncated_tokens:
        headers["x-llmfleet-truncated-tokens"] = str(checked.truncated_tokens)
    if waiter is None:
        ADMITTED.add(job.id, job.subject, job.deadline_ms)
        url = f"/v1/tasks/{job.id}"
        return JSONResponse(
            {"id": job.id, "object": "task", "status": "queued", "url": url},
            status_code=202,
            headers={**headers, "Location": url},
        )
    if job.stream:
        # Headers now, so the client has its request id and proxies see traffic while it waits.
        return RelayResponse(
            _relay(state, job, waiter, include_usage, keep=record is not None),
            media_type="text/event-stream",
            headers={**headers, **HEADERS},
        )
    return await _answer(state, job, waiter, request, headers, keep=record is not None)


async def _check(body: Body, model: ModelInfo, max_model_len: int, state: AppState) -> Checked:
    """The length check of body's API: its prompt counted in the model's tokens, max tokens resolved."""
    cap = state.settings.max_tokens_cap
    if isinstance(body, ResponsesRequest | MessagesRequest):
        view = body.chat_view()
        requested = body.requested_max_tokens()
        field, param = body.max_tokens_field, body.input_param
        return await check_translated(
            model, body.engine_payload(), view, requested, max_model_len, cap, field=field, param=param
        )
    check = check_chat if isinstance(body, ChatCompletionRequest) else check_completion
    payload = body.engine_payload()
    return await check(model, payload, body.requested_max_tokens(), max_model_len, cap, state.settings.truncate_prompts)


def _rejected(state: AppState, reason: str, error: APIError) -> APIError:
    """Count a refusal before queueing by reason, and hand back the error to raise."""
    state.metrics.rejected.labels(reason).inc()
    return error


def _queue_unavailable(state: AppState, error: RedisError) -> APIError:
    """The refusal for a Redis error at admission: queue_error's 503, counted and logged by its cause."""
    busy = pool_exhausted(error)
    if busy:
        # Redis may be healthy: every connection of this gateway's pool stayed busy past its wait.
        log.warning(
            "no free Redis connection: all %d of the pool (LLMFLEET_REDIS_MAX_CONNECTIONS) stayed busy past its wait",
            state.redis.connection_pool.max_connections,
        )
    else:
        log.warning("queue unavailable: %s", error)
    return _rejected(state, "busy" if busy else "redis", queue_error(error))


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _next(
    state: AppState, job: Job, waiter: Waiter, disconnect: asyncio.Task[None] | None, idle_s: float | None = None
) -> ReplyEvent | Result | str:
    """The next event for job: a ReplyEvent, a Result found by polling, "disconnected", "timeout" or "lost".

    idle_s: return "idle" when nothing came for that long (after a look at the stored result).
    "lost": the poll found neither a result nor the job record (Producer.poll): Redis lost the request's writes.
    An unreachable Redis is not that: the wait goes on (the answer may still come when it is back).
    """
    poll_s, poll_max_s = state.settings.result_poll_s, state.settings.result_poll_max_s
    loop = asyncio.get_running_loop()
    idle_at = None if idle_s is None else loop.time() + idle_s
    while True:
        remaining_s = (job.deadline_ms + DEADLINE_GRACE_MS - now_ms()) / 1000
        if remaining_s <= 0:
            return "timeout"
        if not waiter.events.empty():
            return waiter.events.get_nowait()
        # Jittered, so waiters admitted together do not poll together.
        wait_s = min(poll_s * random.uniform(0.75, 1.0), remaining_s)  # noqa: S311 (spread, not a secret)
        if idle_at is not None:
            wait_s = max(min(wait_s, idle_at - loop.time()), 0.0)
        get = asyncio.ensure_future(waiter.events.get())
        check_now = asyncio.ensure_future(waiter.check_now.wait())
        wait_for: set[asyncio.Future[Any]] = {get, check_now} if disconnect is None else {get, check_now, disconnect}
        try:
            done, _ = await asyncio.wait(wait_for, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (get, check_now):
                if not pending.done():
                    pending.cancel()
        if get in done:
            return get.result()
        if disconnect is not None and disconnect in done:
            return "disconnected"
        if check_now in done:
            waiter.check_now.clear()
        else:
            poll_s = min(poll_s * 2, poll_max_s)
        # Nothing on the stream for a while: the notification may be lost (trimmed
        # stream, Redis restart); the stored result is the source of truth. The
        # same round trip asks whether the job still exists at all.
        try:
            polled = await state.producer.poll(job.id)
        except RedisError:
            polled = "pending"
        if polled == "lost":
            return "lost"
        if isinstance(polled, Result):
            return polled
        if idle_at is not None and loop.time() >= idle_at:
            return "idle"


def _cancel(state: AppState, job: Job, reason: str) -> None:
    state.metrics.cancelled.labels(reason).inc()
    log.info("request %s: %s; cancelling it", job.id, reason)

    async def cancel() -> None:
        try:
            await state.producer.cancel(job.id, job.subject)
        except RedisError as error:
            log.warning("request %s: could not cancel: %s", job.id, error)

    state.spawn(cancel())


def _delivered(state: AppState, job: Job) -> None:
    """The answer reached its client: keep its stored copy delivered_grace_s more (set in the next trim, no round trip).

    Not for a request with an Idempotency-Key: its retry may come until the key's retention ends.
    """
    state.replies.expire_later(state.producer.delivered_keys(job.id), state.settings.queue.delivered_grace_s)


def _lost(state: AppState, job: Job, mode: str) -> None:
    state.metrics.lost.labels(mode).inc()
    log.warning("request %s: neither its result nor its job is in Redis (it lost writes); answering 503", job.id)


def _timeout_body(job: Job) -> dict[str, Any]:
    return error_body("no answer before the request's deadline; it was cancelled", "timeout", "deadline_exceeded")


async def _answer(
    state: AppState,
    job: Job,
    waiter: Waiter,
    request: Request,
    headers: dict[str, str],
    *,
    keep: bool,
) -> Response:
    """Wait for a sync request's answer, watching for the client going away.

    keep: the request has an Idempotency-Key; a client going away does not cancel it (its retry wants the answer).
    """
    disconnect = asyncio.ensure_future(_wait_disconnect(request))
    path = request.url.path
    try:
        while True:
            event = await _next(state, job, waiter, disconnect)
            if event == "disconnected":
                if not keep:
                    _cancel(state, job, "client_disconnected")
                return Response(status_code=499)
            if event == "timeout":
                _cancel(state, job, "deadline")
                return JSONResponse(shaped(path, 504, _timeout_body(job)), status_code=504, headers=headers)
            if event == "lost":
                _lost(state, job, "sync")
                lost_headers = {**headers, "Retry-After": str(LOST_RETRY_AFTER_S)}
                return JSONResponse(shaped(path, 503, lost_body()), status_code=503, headers=lost_headers)
            result = _as_result(event)
            if result is not None:
                if not keep:
                    _delivered(state, job)
                body = shaped(path, result.status, result.body)
                return JSONResponse(body, status_code=result.status, headers=headers)
            # a chunk for a non-streaming request cannot happen; ignore it
    except asyncio.CancelledError:
        # The server is stopping and its grace period is over (uvicorn cancels what still runs): nobody will read
        # this answer, so the workers should not spend engine time on it. The lifespan waits for the cancel.
        if not keep:
            _cancel(state, job, "gateway_shutdown")
        raise
    finally:
        disconnect.cancel()
        state.replies.unregister(job.id)


class RelayResponse(StreamingResponse):
    """A stream that always closes its relay, so the relay's cleanup (cancel, unregister) runs when the response ends.

    Starlette stops iterating without closing the generator when a disconnect
    lands while it waits in send(); the cleanup would then wait for the GC.
    """

    def __init__(self, relay: AsyncGenerator[bytes, None], **kwargs: Any) -> None:
        super().__init__(relay, **kwargs)
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.relay.aclose()


def _as_result(event: ReplyEvent | Result | str) -> Result | None:
    if isinstance(event, Result):
        return event
    if isinstance(event, ReplyEvent) and event.kind == "final":
        return Result.from_json(event.data)
    return None


async def _relay(
    state: AppState, job: Job, waiter: Waiter, include_usage: bool, *, keep: bool
) -> AsyncGenerator[bytes, None]:
    """Server-sent events for a streamed request, from admission on; always ends with `data: [DONE]`.

    Keep-alive comments whenever nothing was sent for stream_keepalive_s (in the
    queue, or while a broken stream is taken over by another worker). Chunk
    events are relayed in seq order; at a gap, later ones wait at most
    result_poll_s (sse.Sequencer): by then the stored result has been looked
    at, so a final result that is near fills the gap exactly. The final
    result ends the stream with what the client lacks (all of it when the
    answer came whole), or with its error as a `data: {"error": ...}` event.
    """
    loop = asyncio.get_running_loop()
    keepalive_s = state.settings.stream_keepalive_s
    sent: dict[int, Sent] = {}
    order = Sequencer(patience_s=state.settings.result_poll_s)
    finished = False
    wrote = loop.time()
    try:
        while True:
            now = loop.time()
            idle_s = max(keepalive_s - (now - wrote), 0.0)
            gap_s = order.wait_s(now)
            event = await _next(state, job, waiter, None, idle_s if gap_s is None else min(idle_s, gap_s))
            if event == "timeout":
                _cancel(state, job, "deadline")
                for data in stream_error(job, 504, _timeout_body(job), sent):
                    yield data
                finished = True
                return
            if event == "lost":
                _lost(state, job, "stream")
                finished = True  # nothing left to cancel
                for data in stream_error(job, 503, lost_body(), sent):
                    yield data
                return
            result = _as_result(event)
            if result is not None:
                if order.pending:
                    log.info("request %s: chunk event %d never came; the final result fills in", job.id, order.expected)
                for data in final_events(job, sent, result, include_usage):
                    yield data
                finished = True
                if not keep:
                    _delivered(state, job)
                return
            if isinstance(event, ReplyEvent):
                ready = order.add(event.seq, event.data, loop.time())
            else:  # idle
                skipped = order.skipped
                ready = order.give_up(loop.time())
                if order.skipped > skipped:
                    log.warning(
                        "request %s: %d chunk event(s) lost before seq %d; relaying what follows without them",
                        job.id,
                        order.skipped - skipped,
                        order.expected - len(ready),
                    )
            for batch in ready:
                for data in json.loads(batch):
                    track(job, sent, data)
                    yield frame(job, data)
                wrote = loop.time()
            if loop.time() - wrote >= keepalive_s:
                yield KEEPALIVE
                wrote = loop.time()
    finally:
        state.replies.unregister(job.id)
        if not finished and not keep:
            _cancel(state, job, "client_disconnected")
