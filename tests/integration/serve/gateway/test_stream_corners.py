"""A stream's corner cases end to end: real gateway, Redis, worker and vLLM (llmfleet/serve/gateway/service.py).

- A `stream: true` request gets its SSE headers (and request id) once admitted,
  and keep-alive comments while it waits in the queue; the official openai SDK
  reads through them, even with a read timeout shorter than the wait.
- An error after the headers is a `data: {"error": ...}` event, which the SDK
  raises as openai.APIError; errors before admission keep their status.
- An answer that comes whole (no chunk relayed) still reaches the client as
  chunks in OpenAI's streaming shape.
- A missing chunk number holds later chunks back for at most the result poll
  interval, not until the end.

"In the queue" is made certain by SIGSTOPping the workers: the request is
admitted (their reports are fresh) and nobody takes it until they resume.
Where a corner cannot be produced on demand (an answer that arrives with no
chunk before it, chunk events lost on the way), the test plays the worker's
part on the queue's keys, with the worker's own data shapes; it says so where
it does.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from llmfleet.serve.queue.jobs import Result
from tests.integration.serve.gateway.gatewaystack import GATEWAY_ID, PREFIX, Stack, wait_for

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
REPLY = f"{PREFIX}:reply:{GATEWAY_ID}"
SUBJECT = "stream-corners"
# The stack's LLMFLEET_GATEWAY_STREAM_KEEPALIVE_S and LLMFLEET_GATEWAY_RESULT_POLL_S (gatewaystack.py).
KEEPALIVE_S = 0.5
RESULT_POLL_S = 1.0


def chat(content: str = "Say something", max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


@pytest.fixture
def frozen(stack: Stack) -> Iterator[threading.Event]:
    """Every worker SIGSTOPped: an admitted request stays queued until the event is set (or the test ends)."""
    workers = stack.live_workers()
    assert workers, "the stack has no worker"
    thaw = threading.Event()

    def resume() -> None:
        thaw.wait()
        for worker in workers:
            worker.signal(signal.SIGCONT)

    for worker in workers:
        worker.signal(signal.SIGSTOP)
    resumer = threading.Thread(target=resume, daemon=True)
    resumer.start()
    try:
        yield thaw
    finally:
        thaw.set()
        resumer.join(10)
        stack.wait_gateway_ready()


def task(stack: Stack, request_id: str) -> dict[str, Any]:
    with stack.client() as client:
        response = client.get(f"/v1/tasks/{request_id}", headers=stack.auth(SUBJECT))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def cancel(stack: Stack, request_id: str) -> None:
    """Cancel a queued request the test answered itself, so the resumed worker does not run it."""
    with stack.client() as client:
        response = client.delete(f"/v1/tasks/{request_id}", headers=stack.auth(SUBJECT))
    assert response.status_code == 200, response.text


def data_events(lines: list[str]) -> list[Any]:
    """The data of each `data:` line: parsed JSON, or "[DONE]"."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def content(events: list[Any], kind: str = "chat") -> str:
    """The streamed text of choice 0, in order."""
    text = []
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices", []):
            if kind == "chat":
                text.append((choice.get("delta") or {}).get("content") or "")
            else:
                text.append(choice.get("text") or "")
    return "".join(text)


class Lines:
    """An SSE response read line by line from a thread, so the test can look while the stream is open."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(response,), daemon=True)
        self._thread.start()

    def _read(self, response: httpx.Response) -> None:
        try:
            for line in response.iter_lines():
                if line:
                    self.lines.append(line)
        except BaseException as error:  # handed to the test, which asserts on it
            self.error = error

    def join(self, timeout_s: float) -> list[str]:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the stream did not end: {self.lines[-5:]}"
        assert self.error is None, repr(self.error)
        return self.lines


# The test's stand-in for a worker: the same fields and shapes as the CHUNK and DELIVER scripts write.


def chunk_event(stack: Stack, request_id: str, seq: int, text: str, finish: str | None = None) -> None:
    delta = {"role": "assistant", "content": text} if seq == 1 else {"content": text}
    chunk = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "tiny",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    fields = {"id": request_id, "kind": "chunk", "seq": seq, "text": text, "data": json.dumps([chunk])}
    with stack.redis.client() as client:
        client.xadd(REPLY, fields)


def deliver(stack: Stack, request_id: str, result: Result, *, announce: bool) -> None:
    """Store the result (the worker then skips the request), and announce it on the reply stream if asked."""
    with stack.redis.client() as client:
        client.set(f"{PREFIX}:result:{request_id}", result.to_json(), ex=600)
        if announce:
            client.xadd(REPLY, {"id": request_id, "kind": "final", "data": result.to_json()})


def test_a_queued_stream_gets_headers_at_once_and_keepalives_until_its_answer(
    stack: Stack, frozen: threading.Event
) -> None:
    # A read timeout far below the wait: without headers and keep-alives the read would fail.
    with (
        httpx.Client(base_url=stack.url, timeout=3, trust_env=False) as client,
        client.stream("POST", CHAT, json=chat(stream=True), headers=stack.auth(SUBJECT)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        request_id = response.headers["x-request-id"]
        reader = Lines(response)
        wait_for(lambda: reader.lines.count(": keep-alive") >= 3, 20, "keep-alive comments")
        assert task(stack, request_id)["status"] == "queued"
        assert not any(line.startswith("data:") for line in reader.lines)
        frozen.set()
        lines = reader.join(60)
    events = data_events(lines)
    assert events[-1] == "[DONE]"
    assert content(events), lines
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(event["id"] == f"chatcmpl-{request_id}" for event in events[:-1])


def test_the_openai_sdk_reads_a_stream_that_waited_in_the_queue_past_its_read_timeout(
    stack: Stack, frozen: threading.Event
) -> None:
    sdk = OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token(SUBJECT), max_retries=0, timeout=2.0)
    messages: list[Any] = [{"role": "user", "content": "Count to five"}]
    started = time.monotonic()
    stream = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=8, stream=True)
    assert time.monotonic() - started < 2.0
    request_id = stream.response.headers["x-request-id"]
    texts: list[str] = []
    finishes: list[str] = []
    failure: list[BaseException] = []

    def consume() -> None:
        try:
            for chunk in stream:
                for choice in chunk.choices:
                    texts.append(choice.delta.content or "")
                    if choice.finish_reason:
                        finishes.append(choice.finish_reason)
        except BaseException as error:  # asserted below
            failure.append(error)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(4.0)  # twice the SDK's read timeout, in the queue
    assert task(stack, request_id)["status"] == "queued"
    assert reader.is_alive() and not failure, failure
    frozen.set()
    reader.join(60)
    assert not reader.is_alive() and not failure, failure
    assert "".join(texts) and finishes == [finishes[-1]] and finishes[-1] in ("stop", "length")


def test_an_error_after_the_headers_is_an_sse_error_event_the_sdk_raises(stack: Stack, frozen: threading.Event) -> None:
    sdk = OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token(SUBJECT), max_retries=0, timeout=30)
    messages: list[Any] = [{"role": "user", "content": "Hello"}]
    # Known before admission: the status and JSON body, as for any request.
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4, stream=True)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 300}],
            max_tokens=4,
            stream=True,
        )
    assert too_long.value.code == "context_length_exceeded"

    # After admission the headers are out (200), so an error comes as an event. Here two requests are
    # cancelled while queued (DELETE /v1/tasks/{id}); the resumed worker answers each with a 499.
    stream = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=4, stream=True)
    assert stream.response.status_code == 200
    cancel(stack, stream.response.headers["x-request-id"])
    with (
        stack.client() as client,
        client.stream("POST", CHAT, json=chat(stream=True), headers=stack.auth(SUBJECT)) as response,
    ):
        assert response.status_code == 200
        cancel(stack, response.headers["x-request-id"])
        frozen.set()
        # On the wire: one error event, then [DONE].
        lines = [line for line in response.iter_lines() if line and not line.startswith(":")]
    cancelled = {"message": "the client cancelled the request", "type": "cancelled", "code": "client_closed"}
    assert data_events(lines) == [{"error": cancelled}, "[DONE]"]
    # Through the SDK: create() returned; iterating raises the error.
    with pytest.raises(openai.APIError) as error:
        for _ in stream:
            pass
    assert not isinstance(error.value, openai.APIStatusError)  # raised from the stream, not from a status
    assert error.value.message == cancelled["message"]
    assert error.value.body == cancelled


@pytest.mark.parametrize("announce", [True, False], ids=["announced", "found-by-polling"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_an_answer_that_comes_whole_is_still_streamed(
    stack: Stack, frozen: threading.Event, path: str, announce: bool
) -> None:
    if path == CHAT:
        body = chat(stream=True, stream_options={"include_usage": True})
    else:
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 8, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    with stack.client() as client, client.stream("POST", path, json=body, headers=stack.auth(SUBJECT)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        request_id = response.headers["x-request-id"]
        # The test plays a worker whose chunk events never reached the gateway: the whole answer, and with
        # announce=False not even its announcement (a trimmed reply stream), so the gateway finds it by polling.
        if path == CHAT:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": "Whole answer"},
                                      "logprobs": None, "finish_reason": "stop"}  # fmt: skip
            whole = {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "model": "tiny"}
        else:
            choice = {"index": 0, "text": "Whole answer", "logprobs": None, "finish_reason": "stop"}
            whole = {"id": f"cmpl-{request_id}", "object": "text_completion", "model": "tiny"}
        deliver(stack, request_id, Result(200, {**whole, "choices": [choice], "usage": usage}), announce=announce)
        lines = [line for line in response.iter_lines() if line and not line.startswith(":")]
    events = data_events(lines)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage
    kind = "chat" if path == CHAT else "completion"
    assert content(chunks, kind) == "Whole answer"
    assert {event["object"] for event in chunks} == {"chat.completion.chunk" if path == CHAT else "text_completion"}
    if path == CHAT:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_a_missing_chunk_number_holds_later_chunks_back_only_briefly(stack: Stack, frozen: threading.Event) -> None:
    with (
        stack.client() as client,
        client.stream("POST", CHAT, json=chat(stream=True), headers=stack.auth(SUBJECT)) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        reader = Lines(response)
        # The test plays the worker, and loses chunk event 2 on the way.
        chunk_event(stack, request_id, 1, "Hello")
        wait_for(lambda: "Hello" in content(data_events(reader.lines)), 10, "the first chunk")
        chunk_event(stack, request_id, 3, " wide")
        chunk_event(stack, request_id, 4, " world", finish="stop")
        started = time.monotonic()
        # Without an end to the wait, these would only come with the final result (never sent here).
        wait_for(lambda: content(data_events(reader.lines)) == "Hello wide world", 10, "the chunks after the gap")
        held_s = time.monotonic() - started
        assert held_s < RESULT_POLL_S + 3, held_s
        chunk_event(stack, request_id, 5, "!")  # after the gap: at once
        wait_for(lambda: content(data_events(reader.lines)).endswith("!"), 2, "a chunk after the skipped gap")
        usage = {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}
        choice = {"index": 0, "message": {"role": "assistant", "content": "Hello big wide world!"},
                  "logprobs": None, "finish_reason": "stop"}  # fmt: skip
        deliver(stack, request_id, Result(200, {"choices": [choice], "usage": usage}), announce=True)
        lines = reader.join(30)
    assert data_events(lines)[-1] == "[DONE]"
    # What was lost stays lost (it is logged); nothing is sent twice or out of order.
    assert content(data_events(lines)) == "Hello wide world!"


def test_a_gap_the_final_result_closes_within_the_wait_gives_the_exact_text(
    stack: Stack, frozen: threading.Event
) -> None:
    with (
        stack.client() as client,
        client.stream("POST", CHAT, json=chat(stream=True), headers=stack.auth(SUBJECT)) as response,
    ):
        request_id = response.headers["x-request-id"]
        chunk_event(stack, request_id, 1, "Hello")
        chunk_event(stack, request_id, 3, " world")
        choice = {"index": 0, "message": {"role": "assistant", "content": "Hello big world"},
                  "logprobs": None, "finish_reason": "stop"}  # fmt: skip
        deliver(stack, request_id, Result(200, {"choices": [choice]}), announce=True)
        lines = [line for line in response.iter_lines() if line and not line.startswith(":")]
    events = data_events(lines)
    assert content(events) == "Hello big world" and events[-1] == "[DONE]"
