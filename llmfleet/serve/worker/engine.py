"""Calling engines for one attempt of a job: balancing, retries within a budget, timeouts, streaming.

HTTP to engines and nothing else: what a call has to tell the queue while it
runs (a streamed chunk, an engine that died serving it) goes to the Reporter it
is given (job.py's, which publishes and counts in Redis); this module knows no
Redis.

Length: over 500 lines because balancing, retries and the stream continuation all
serve one attempt and share its state; splitting them would pass that state around.

Retries: a connection error, a timeout or a 5xx from an engine is retried on
another engine (when there is one) up to `retries` more times, with backoff,
and never past the job's deadline. A 4xx is the request's fault: it is the
answer, not retried.

Streaming: chunks go to the gateway as they arrive (Reporter.chunk). If the engine
fails after some text was sent, the retry does not start over: it continues
the text already sent (chat: the text as a final assistant message with
continue_final_message; completions: the prompt plus the text), with
max_tokens reduced by what was generated. The same continuation serves a new
attempt after a worker died mid-stream: BEGIN returns the text sent so far.
So a client's stream never repeats or contradicts itself.

The Responses and Messages APIs stream named events, passed through as the
engine writes them (ids and model name set as in every answer); their stored
result is the whole answer put together from the events (queue.events). An
event stream is not continued: if it breaks after events went out, the
request fails (a 502 the client gets as its stream's error event).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from llmfleet.serve.queue.events import Assembler, delta_text
from llmfleet.serve.queue.jobs import EVENT_KINDS, Job, Result, error_body, now_ms
from llmfleet.serve.worker.metrics import WorkerMetrics
from llmfleet.serve.worker.pool import Engine, EnginePool

log = logging.getLogger(__name__)

# The longest line an engine's event stream may send: aiohttp refuses a line
# over twice its read buffer. A chunk with logprobs runs to a few KiB.
READ_BUFFER_BYTES = 1 << 20


def engine_session(
    connections: int, connect_timeout_s: float, read_timeout_s: float, api_key: str | None = None
) -> aiohttp.ClientSession:
    """The HTTP client for engines: keep-alive connections for `connections` requests at once.

    aiohttp rather than httpx: on the 2-core lab machine httpx cost the worker
    about 1.3 ms of CPU a request against 0.06 ms (loopback, uvloop). Engines are
    on the operator's network: the session never takes a proxy from the
    environment (trust_env stays off). With api_key, every request carries it
    as a bearer token: vLLM's --api-key guards /v1 (not /health or /metrics).
    """
    return aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        connector=aiohttp.TCPConnector(limit=connections * 2, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s),
        read_bufsize=READ_BUFFER_BYTES,
        trust_env=False,
    )


# Answer ids are the request id behind each API's own prefix, so a client can match an answer to x-request-id.
RESPONSE_ID_PREFIXES = {"chat": "chatcmpl-", "completion": "cmpl-", "responses": "resp_", "messages": "msg_"}

# The error code of a request dead-lettered because engines died serving it.
POISON_CODE = "poison_request"


class EngineFailure(Exception):
    """One engine call failed; reason is a metric label, status what the client gets if it is final."""

    def __init__(
        self,
        reason: str,
        message: str,
        status: int = 502,
        *,
        retryable: bool = True,
        blame_engine: bool = True,
        reached: bool = False,
    ) -> None:
        super().__init__(message)
        # The engine had received the request when it failed (a broken connection, a 5xx): if it is dead
        # now, it may be this request that killed it.
        self.reached = reached
        self.reason = reason
        self.message = message
        self.status = status
        self.retryable = retryable
        self.blame_engine = blame_engine

    def result(self, attempt: int, worker: str) -> Result:
        kind = {504: "timeout", 422: "invalid_request_error"}.get(self.status, "engine_error")
        return Result(self.status, error_body(self.message, kind, self.reason), attempt=attempt, worker=worker)


def normalize_error(status: int, content: bytes) -> dict[str, Any]:
    """An engine's error response in OpenAI's shape, whatever version of vLLM wrote it."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return {"error": {**error, "code": error.get("code", status)}}
        if "message" in body:
            return error_body(str(body["message"]), str(body.get("type", "invalid_request_error")), status)
    text = content.decode(errors="replace")[:500]
    return error_body(text or f"engine answered {status}", "invalid_request_error", status)


@dataclass
class ChoiceState:
    """One choice of a streamed answer, put together from its chunks for the stored result."""

    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] = field(default_factory=list)
    completion_logprobs: dict[str, list[Any]] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, kind: str, choice: dict[str, Any], text: str) -> None:
        self.text.append(text)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            if kind == "chat":
                self.logprobs.extend(logprobs.get("content") or [])
            else:
                for key, values in logprobs.items():
                    if isinstance(values, list):
                        self.completion_logprobs.setdefault(key, []).extend(values)
        for delta in (choice.get("delta") or {}).get("tool_calls") or []:
            call = self.tool_calls.setdefault(
                int(delta.get("index", 0)), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if delta.get("id"):
                call["id"] = delta["id"]
            function = delta.get("function") or {}
            if function.get("name"):
                call["function"]["name"] += function["name"]
            if function.get("arguments"):
                call["function"]["arguments"] += function["arguments"]

    def body(self, kind: str, index: int, partial: str) -> dict[str, Any]:
        text = partial + "".join(self.text)
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
                message["content"] = text or None
            logprobs = {"content": self.logprobs} if self.logprobs else None
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": self.finish_reason}
        completion = self.completion_logprobs or None
        return {"index": index, "text": text, "logprobs": completion, "finish_reason": self.finish_reason}


@dataclass
class StreamState:
    """What one attempt of a streamed job has generated so far (including earlier attempts' text).

    text is what the queue's partial text holds (every choice's text, in
    arrival order): a continuation carries on from it, which only makes sense
    for one choice without tools (see continuable).
    """

    text: list[str]
    tokens: int
    finish_reason: str | None = None
    engine_prompt_tokens: int | None = None
    role_sent: bool = False
    choices: dict[int, ChoiceState] = field(default_factory=dict)
    final_usage: dict[str, Any] | None = None
    partial: str = ""


def continuable(job: Job) -> bool:
    """Whether a broken stream of this job can be continued from its text: one choice, no tool calls."""
    return int(job.payload.get("n") or 1) == 1 and not job.payload.get("tools")


class Reporter(Protocol):
    """What one attempt's engine calls tell the queue while they run (job.py's AttemptReporter does it)."""

    def chunk(self, data: str, text: str, tokens: int) -> None:
        """Send a streamed chunk or event (JSON) on, in order; raises to stop the call (fenced off, Redis gone)."""

    async def engine_died(self, engine_url: str) -> int | None:
        """Count an engine's death against the request: the deaths so far, all attempts; None if not counted."""


@dataclass
class EngineCaller:
    pool: EnginePool
    http: aiohttp.ClientSession
    metrics: WorkerMetrics
    worker_id: str
    retries: int
    retry_backoff_s: float
    request_timeout_s: float
    health_interval_s: float
    poison_after: int = 2
    _created: float = field(default_factory=time.time)

    async def run(self, job: Job, attempt: int, partial: str, partial_tokens: int, reporter: Reporter) -> Result:
        """One attempt's answer; partial and partial_tokens: what earlier attempts streamed (BEGIN's)."""
        if job.stream and job.kind in EVENT_KINDS:
            return await self._event_stream(job, attempt, partial_tokens, reporter)
        if job.stream:
            return await self._stream(job, attempt, partial, partial_tokens, reporter)
        return await self._with_retries(job, attempt, reporter, lambda engine: self._plain_call(engine, job, attempt))

    async def _with_retries(
        self, job: Job, attempt: int, reporter: Reporter, call: Callable[[Engine], Awaitable[Result]]
    ) -> Result:
        excluded: set[str] = set()
        failures = 0
        last = EngineFailure("no_engine", f"no healthy engine serves model {job.model!r}", 503, blame_engine=False)
        while True:
            remaining_s = (job.deadline_ms - now_ms()) / 1000
            if remaining_s <= 0:
                self.metrics.errors.labels("timeout").inc()
                return EngineFailure(
                    "timeout", f"the request ran past its deadline; last problem: {last.message}", 504
                ).result(attempt, self.worker_id)
            engine = self.pool.pick(job.model, frozenset(excluded), job.payload)
            if engine is None:
                last = EngineFailure(
                    "no_engine", f"no healthy engine serves model {job.model!r}", 503, blame_engine=False
                )
                self.metrics.errors.labels("no_engine").inc()
                failures += 1
                if failures > self.retries:
                    return last.result(attempt, self.worker_id)
                await self.pool.wait_changed(min(remaining_s, self.health_interval_s))
                continue
            timeout_s = min(self.request_timeout_s, remaining_s)
            try:
                with self.pool.using(engine):
                    async with asyncio.timeout(timeout_s):
                        result = await call(engine)
                self.pool.succeeded(engine)
                return result
            except aiohttp.ServerTimeoutError as error:  # a TimeoutError as well: caught first
                last = EngineFailure("timeout", f"engine {engine.url} timed out ({type(error).__name__})", 504)
            except TimeoutError:
                last = EngineFailure("timeout", f"engine {engine.url} did not finish within {timeout_s:.1f} s", 504)
            except aiohttp.ClientConnectorError as error:  # never connected: the request did not reach it
                last = EngineFailure("connect", f"engine {engine.url} unreachable ({type(error).__name__})", 502)
            except aiohttp.ClientError as error:  # connected, then the connection broke: the engine had the request
                last = EngineFailure(
                    "connect", f"engine {engine.url} unreachable ({type(error).__name__})", 502, reached=True
                )
            except EngineFailure as failure:
                last = failure
            self.metrics.errors.labels(last.reason).inc()
            if last.blame_engine:
                self.pool.failed(engine, last.reason)
            poison = await self._engine_died(job, engine, last, reporter)
            if poison is not None:
                return poison.result(attempt, self.worker_id)
            if not last.retryable:
                return last.result(attempt, self.worker_id)
            failures += 1
            excluded.add(engine.url)
            if failures > self.retries:
                return last.result(attempt, self.worker_id)
            log.info("request %s: %s; retry %d of %d", job.id, last.message, failures, self.retries)
            await asyncio.sleep(self.retry_backoff_s * 2 ** (failures - 1))

    async def _engine_died(
        self, job: Job, engine: Engine, failure: EngineFailure, reporter: Reporter
    ) -> EngineFailure | None:
        """After a dropped connection or a 5xx: if the engine is dead now, count it against the request.

        A request during which `poison_after` engines died (across all its
        attempts: the count lives in the job's hash) is poison: it is not sent
        to another engine, and the worker dead-letters it (POISON_CODE).
        """
        if not failure.reached or await self.pool.alive(engine):
            return None
        deaths = await reporter.engine_died(engine.url)
        if deaths is None:
            return None
        log.error("request %s: engine %s died while serving it (%d so far)", job.id, engine.url, deaths)
        self.metrics.errors.labels("engine_died").inc()
        if deaths < self.poison_after:
            return None
        return EngineFailure(
            POISON_CODE,
            f"{deaths} engines died while serving this request, so it is not tried again: it may be what kills"
            " them. It was set aside for the operator; if this was a coincidence, send it again later",
            422,
            retryable=False,
            blame_engine=False,
        )

    def _response_id(self, job: Job) -> str:
        return f"{RESPONSE_ID_PREFIXES[job.kind]}{job.id}"

    async def _plain_call(self, engine: Engine, job: Job, attempt: int) -> Result:
        async with self.http.post(f"{engine.url}{job.endpoint}", json=job.payload) as response:
            status, content = response.status, await response.read()
        if status >= 500:
            raise EngineFailure("engine_5xx", f"engine {engine.url} answered {status}", 502, reached=True)
        if status != 200:
            self.metrics.errors.labels("engine_4xx").inc()
            return Result(status, normalize_error(status, content), attempt=attempt, worker=self.worker_id)
        try:
            body = json.loads(content)
        except ValueError:
            raise EngineFailure(
                "engine_5xx", f"engine {engine.url} answered 200 with a body that is not JSON"
            ) from None
        if not isinstance(body, dict):
            raise EngineFailure("engine_5xx", f"engine {engine.url} answered 200 with a body that is not an object")
        body["id"] = self._response_id(job)
        body["model"] = job.model
        return Result(200, body, attempt=attempt, worker=self.worker_id)

    async def _stream(self, job: Job, attempt: int, partial: str, partial_tokens: int, reporter: Reporter) -> Result:
        state = StreamState(
            text=[partial] if partial else [], tokens=partial_tokens, role_sent=bool(partial), partial=partial
        )
        result = await self._with_retries(
            job, attempt, reporter, lambda engine: self._stream_call(engine, job, attempt, state, reporter)
        )
        if result.status != 200:
            return result
        prompt_tokens = job.prompt_tokens if state.engine_prompt_tokens is None else state.engine_prompt_tokens
        choices = state.choices or {0: ChoiceState()}
        if 0 in choices and choices[0].finish_reason is None:
            choices[0].finish_reason = state.finish_reason  # "length" when max_tokens ran out between attempts
        completion_tokens = state.tokens
        if state.final_usage is not None and not state.partial:
            completion_tokens = int(state.final_usage.get("completion_tokens") or completion_tokens)
        body = {
            "id": self._response_id(job),
            "object": "chat.completion" if job.kind == "chat" else "text_completion",
            "created": job.enqueued_ms // 1000,
            "model": job.model,
            "choices": [
                choices[index].body(job.kind, index, state.partial if index == 0 else "") for index in sorted(choices)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return Result(200, body, attempt=attempt, worker=self.worker_id)

    def _continuation(self, job: Job, state: StreamState) -> dict[str, Any] | None:
        """The engine request that carries on from state's text; None when max_tokens is used up."""
        payload = dict(job.payload)
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        text = "".join(state.text)
        if not text:
            return payload
        if not continuable(job):
            raise EngineFailure(
                "continuation",
                "the stream broke after chunks were sent, and an answer with several choices or tool calls"
                " cannot be continued",
                502,
                retryable=False,
                blame_engine=False,
            )
        remaining = job.max_tokens - state.tokens
        if remaining <= 0:
            return None
        payload["max_tokens"] = remaining
        if job.kind == "chat":
            payload["messages"] = [*payload["messages"], {"role": "assistant", "content": text}]
            payload["add_generation_prompt"] = False
            payload["continue_final_message"] = True
        elif isinstance(payload.get("prompt"), str):
            payload["prompt"] = payload["prompt"] + text
        else:
            raise EngineFailure(
                "continuation",
                "the stream broke after text was sent and a prompt of token ids cannot be continued",
                502,
                retryable=False,
                blame_engine=False,
            )
        return payload

    async def _refusal(
        self, engine: Engine, response: aiohttp.ClientResponse, attempt: int, *, continuing: bool = False
    ) -> Result | None:
        """A stream's opening answer: None for a 200, the engine's 4xx as the request's answer; a 5xx raises.

        continuing: the call carries on a stream the client has part of; a 4xx to it fails the request.
        """
        if response.status >= 500:
            raise EngineFailure("engine_5xx", f"engine {engine.url} answered {response.status}", 502, reached=True)
        if response.status == 200:
            return None
        content = await response.read()
        self.metrics.errors.labels("engine_4xx").inc()
        if continuing:
            message = f"engine {engine.url} refused to continue the stream ({response.status})"
            raise EngineFailure("engine_4xx", message, 502, retryable=False)
        body = normalize_error(response.status, content)
        return Result(response.status, body, attempt=attempt, worker=self.worker_id)

    async def _stream_call(
        self, engine: Engine, job: Job, attempt: int, state: StreamState, reporter: Reporter
    ) -> Result:
        payload = self._continuation(job, state)
        if payload is None:
            state.finish_reason = state.finish_reason or "length"
            return Result(200, {}, attempt=attempt, worker=self.worker_id)
        fresh = not state.text
        async with self.http.post(f"{engine.url}{job.endpoint}", json=payload) as response:
            refused = await self._refusal(engine, response, attempt, continuing=bool(state.text))
            if refused is not None:
                return refused
            generated = 0  # this call's completion tokens so far, as the engine counts them
            async for line in response.content:  # lines, each with its b"\n"
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise EngineFailure("engine_5xx", f"engine {engine.url} failed mid-stream", 502, reached=True)
                choices = [item for item in chunk.get("choices") or [] if isinstance(item, dict)]
                texts = []
                for item in choices:
                    piece = (item.get("delta") or {}).get("content") if job.kind == "chat" else item.get("text")
                    texts.append(piece if isinstance(piece, str) else "")
                text = "".join(texts)
                usage = chunk.pop("usage", None)
                if isinstance(usage, dict):
                    if fresh and usage.get("prompt_tokens") is not None:
                        state.engine_prompt_tokens = int(usage["prompt_tokens"])
                    total = int(usage.get("completion_tokens") or 0)
                    tokens = max(total - generated, 0)
                    generated = max(generated, total)
                else:  # an engine without usage stats: one token per chunk with text
                    tokens = 1 if text else 0
                if not choices:
                    state.tokens += tokens  # the closing usage-only chunk
                    if isinstance(usage, dict):
                        state.final_usage = usage
                    continue
                first = choices[0]
                finish = first.get("finish_reason")
                opening = not text and finish is None and not (first.get("delta") or {}).get("tool_calls")
                if job.kind == "chat" and len(choices) == 1 and opening and not first.get("logprobs"):
                    if state.role_sent and continuable(job):
                        state.tokens += tokens
                        continue  # a continuation's role-only opening chunk: the client has one already
                    state.role_sent = True
                chunk["id"] = self._response_id(job)
                chunk["model"] = job.model
                chunk["created"] = job.enqueued_ms // 1000
                reporter.chunk(json.dumps(chunk, separators=(",", ":")), text, tokens)
                state.text.append(text)
                state.tokens += tokens
                for item, piece in zip(choices, texts, strict=True):
                    index = int(item.get("index") or 0)
                    state.choices.setdefault(index, ChoiceState()).add(job.kind, item, piece)
                    if index == 0 and item.get("finish_reason") is not None:
                        state.finish_reason = item["finish_reason"]
        return Result(200, {}, attempt=attempt, worker=self.worker_id)

    async def _event_stream(self, job: Job, attempt: int, partial_tokens: int, reporter: Reporter) -> Result:
        """A streamed Responses or Messages request: its events relayed as they come, its whole answer stored."""
        if partial_tokens:
            return self._not_continuable(job).result(attempt, self.worker_id)
        answer = Assembler(job.kind)
        result = await self._with_retries(
            job, attempt, reporter, lambda engine: self._event_call(engine, job, attempt, answer, reporter)
        )
        if result.status != 200:
            return result
        if answer.body is None:
            message = "the engine's event stream ended before its final event"
            return EngineFailure("engine_5xx", message).result(attempt, self.worker_id)
        answer.body["id"] = self._response_id(job)
        answer.body["model"] = job.model
        return Result(200, answer.body, attempt=attempt, worker=self.worker_id)

    def _not_continuable(self, job: Job) -> EngineFailure:
        return EngineFailure(
            "continuation",
            f"the stream broke after events were sent; a {job.endpoint} event stream cannot be continued",
            502,
            retryable=False,
            blame_engine=False,
        )

    def _event(self, job: Job, event: dict[str, Any]) -> dict[str, Any]:
        """An engine's event with the answer's id and model as every answer of this request has them."""
        for key in ("response", "message"):
            inner = event.get(key)
            if isinstance(inner, dict) and "id" in inner:
                event[key] = {**inner, "id": self._response_id(job), "model": job.model}
        return event

    async def _event_call(
        self, engine: Engine, job: Job, attempt: int, answer: Assembler, reporter: Reporter
    ) -> Result:
        if answer.events:
            raise self._not_continuable(job)
        async with self.http.post(f"{engine.url}{job.endpoint}", json={**job.payload, "stream": True}) as response:
            refused = await self._refusal(engine, response, attempt)
            if refused is not None:
                return refused
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue  # `event:` lines: the type is in the data too
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "error":
                    raise EngineFailure("engine_5xx", f"engine {engine.url} failed mid-stream", 502, reached=True)
                event = self._event(job, event)
                answer.add(event)
                # One "token" an event: the queue's count is then non-zero once any event went out.
                reporter.chunk(json.dumps(event, separators=(",", ":")), delta_text(event), 1)
        return Result(200, {}, attempt=attempt, worker=self.worker_id)
