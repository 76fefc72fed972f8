"""Idempotency-Key end to end: real gateway, Redis, worker and vLLM (llmfleet/serve/gateway/idempotency.py).

A client that retries with the same key gets the first request's answer: the
request runs once, whether the retry comes after the answer or while the
first is still running (and its client gone). The same key with another
request is refused; keys belong to one token subject.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.serve.gateway.gatewaystack import GatedProxy, Stack, engine_proxy, metric_value, wait_for

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"


def chat(content: str = "Say something", max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    # ignore_eos: sampled, the tiny model's first token is now and then its end of sequence, and an answer without
    # text proves no replay (a final run's first stream held one token and no text; the replay test failed).
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def keyed(stack: Stack, key: str, subject: str = "alice", **headers: str) -> dict[str, str]:
    return {**stack.auth(subject), "Idempotency-Key": key, **headers}


def admitted(stack: Stack) -> float:
    """Requests the gateway queued so far, over every lane and mode."""
    assert stack.gateway is not None
    lines = stack.gateway.metrics().splitlines()
    samples = [line for line in lines if line.startswith("llmfleet_gateway_admitted_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples)


def streamed_text(lines: list[str]) -> str:
    """The content of a chat stream's events (data lines), in order."""
    text = []
    for line in lines:
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[5:]).get("choices", []):
            text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def test_a_retry_with_the_same_key_gets_the_first_answer_and_runs_once(stack: Stack) -> None:
    key = uuid.uuid4().hex
    before = admitted(stack)
    with stack.client() as client:
        first = client.post(CHAT, json=chat(), headers=keyed(stack, key))
        assert first.status_code == 200, first.text
        assert "Idempotent-Replayed" not in first.headers
        retry = client.post(CHAT, json=chat(), headers=keyed(stack, key))
    assert retry.status_code == 200, retry.text
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json() == first.json()
    assert admitted(stack) == before + 1, "the retry was queued again"


def test_the_same_key_with_another_request_is_refused_and_the_first_answer_kept(stack: Stack) -> None:
    key = uuid.uuid4().hex
    with stack.client() as client:
        first = client.post(CHAT, json=chat("one question"), headers=keyed(stack, key))
        assert first.status_code == 200, first.text
        other = client.post(CHAT, json=chat("another question"), headers=keyed(stack, key))
        as_stream = client.post(CHAT, json=chat("one question", stream=True), headers=keyed(stack, key))
        again = client.post(CHAT, json=chat("one question"), headers=keyed(stack, key))
    for refused in (other, as_stream):
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("idempotency_key_reused", "Idempotency-Key")
        assert key in error["message"]
    assert again.json() == first.json()


def test_keys_belong_to_one_subject(stack: Stack) -> None:
    key = uuid.uuid4().hex
    with stack.client() as client:
        alice = client.post(CHAT, json=chat(), headers=keyed(stack, key, "alice"))
        bob = client.post(CHAT, json=chat(), headers=keyed(stack, key, "bob"))
    assert alice.status_code == bob.status_code == 200, (alice.text, bob.text)
    assert "Idempotent-Replayed" not in bob.headers
    assert alice.json()["id"] != bob.json()["id"]


# Empty, a space, too long, and non-ASCII bytes (UTF-8, as a careless client sends them).
@pytest.mark.parametrize("key", [b"", b"has space", b"x" * 256, "caf\u00e9".encode()])
def test_a_malformed_key_is_refused_before_anything_runs(stack: Stack, key: bytes) -> None:
    before = admitted(stack)
    with stack.client() as client:
        answer = client.post(CHAT, json=chat(), headers={**stack.auth(), "Idempotency-Key": key})  # type: ignore[dict-item]
    assert answer.status_code == 400, answer.text
    assert "Idempotency-Key" in answer.text or "idempotency-key" in answer.text.lower()
    assert admitted(stack) == before


def test_a_task_retried_with_its_key_gets_the_same_task(stack: Stack) -> None:
    key = uuid.uuid4().hex
    headers = keyed(stack, key, Prefer="respond-async")
    with stack.client() as client:
        first = client.post(CHAT, json=chat(), headers=headers)
        retry = client.post(CHAT, json=chat(), headers=headers)
        assert first.status_code == retry.status_code == 202, (first.text, retry.text)
        assert retry.json()["id"] == first.json()["id"]
        assert retry.headers["Idempotent-Replayed"] == "true"
        task = wait_for(
            lambda: (t := client.get(first.headers["Location"], headers=headers).json())["status"] == "completed" and t,
            60,
            "the task to complete",
        )
    assert task["http_status"] == 200


def test_a_finished_stream_is_replayed_as_server_sent_events(stack: Stack) -> None:
    key = uuid.uuid4().hex
    body = chat(max_tokens=12, stream=True, stream_options={"include_usage": True})
    with stack.client() as client:
        with client.stream("POST", CHAT, json=body, headers=keyed(stack, key)) as first:
            assert first.status_code == 200
            first_lines = [line for line in first.iter_lines() if line]
        with client.stream("POST", CHAT, json=body, headers=keyed(stack, key)) as retry:
            assert retry.status_code == 200
            assert retry.headers["content-type"].startswith("text/event-stream")
            assert retry.headers["Idempotent-Replayed"] == "true"
            retry_lines = [line for line in retry.iter_lines() if line]
    assert streamed_text(first_lines) and streamed_text(retry_lines) == streamed_text(first_lines)
    assert retry_lines[-1] == "data: [DONE]"
    assert any('"usage"' in line for line in retry_lines), "include_usage was not honoured on the replay"


@pytest.fixture
def gated_worker(stack: Stack) -> Iterator[tuple[threading.Event, Counter[str]]]:
    """The only worker sends to the real vLLM behind GatedProxy: answers wait until the event is set."""
    hits: Counter[str] = Counter()
    with engine_proxy(GatedProxy, upstream=stack.vllm.url, hits=hits) as (url, release):
        for worker in stack.live_workers():
            assert worker.stop() == 0, worker.log()[-2000:]
        worker = stack.start_worker([url])
        stack.wait_gateway_ready()
        try:
            yield release, hits
        finally:
            release.set()
            assert worker.stop() == 0, worker.log()[-2000:]
    stack.ensure_one_worker()


def test_a_retry_while_the_first_runs_waits_for_its_answer_and_the_gone_client_cancels_nothing(
    stack: Stack, gated_worker: tuple[threading.Event, Counter[str]]
) -> None:
    release, hits = gated_worker
    key = uuid.uuid4().hex
    before = admitted(stack)
    assert stack.gateway is not None
    cancelled = metric_value(stack.gateway.metrics(), "llmfleet_gateway_cancelled_total", reason="client_disconnected")
    # The first client gives up while its request runs on the (gated) engine.
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=stack.url, timeout=3) as impatient:
        impatient.post(CHAT, json=chat(), headers=keyed(stack, key))
    wait_for(lambda: hits["/v1/chat/completions"] >= 1, 30, "the first request on the engine")

    answers: dict[str, httpx.Response] = {}
    stream_lines: list[str] = []

    def retry_sync() -> None:
        with stack.client() as client:
            answers["sync"] = client.post(CHAT, json=chat(), headers=keyed(stack, key))

    def retry_stream() -> None:
        with stack.client() as client, client.stream(
            "POST", CHAT, json=stream_body, headers=stream_headers
        ) as response:
            answers["stream"] = response
            stream_lines.extend(line for line in response.iter_lines() if line)

    sync = threading.Thread(target=retry_sync, daemon=True)
    sync.start()
    # A stream with its own key, then retried while it runs: keep-alive comments until the answer.
    stream_body, stream_headers = chat(stream=True), keyed(stack, key + "-stream")
    # Its headers and keep-alive comments come at once (no read timeout fires); the client leaves after one.
    with (
        httpx.Client(base_url=stack.url, timeout=30) as impatient,
        impatient.stream("POST", CHAT, json=stream_body, headers=stream_headers) as gone,
    ):
        assert gone.status_code == 200
        assert next(line for line in gone.iter_lines() if line) == ": keep-alive"
    wait_for(lambda: hits["/v1/chat/completions"] >= 2, 30, "the stream's request on the engine")
    stream = threading.Thread(target=retry_stream, daemon=True)
    stream.start()
    wait_for(lambda: ": keep-alive" in stream_lines, 30, "a keep-alive comment on the waiting stream")
    assert sync.is_alive(), f"the sync retry did not wait: {answers.get('sync')}"

    release.set()
    sync.join(60)
    stream.join(60)
    assert answers["sync"].status_code == 200, answers["sync"].text
    assert answers["sync"].headers["Idempotent-Replayed"] == "true"
    assert answers["sync"].json()["choices"][0]["message"]["content"]
    assert stream_lines[-1] == "data: [DONE]" and streamed_text(stream_lines)
    # Two requests ran (one per key), not four; nobody cancelled them when their clients left.
    assert hits["/v1/chat/completions"] == 2
    assert admitted(stack) == before + 2
    after = metric_value(stack.gateway.metrics(), "llmfleet_gateway_cancelled_total", reason="client_disconnected")
    assert after == cancelled


def test_the_openai_sdk_retry_with_an_idempotency_key_gets_the_same_completion(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.token("alice"), max_retries=0)
    key = uuid.uuid4().hex
    messages: list[Any] = [{"role": "user", "content": "Name a colour"}]
    first = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, extra_headers={"Idempotency-Key": key}
    )
    retry = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=8, extra_headers={"Idempotency-Key": key}
    )
    assert retry.headers["Idempotent-Replayed"] == "true"
    replayed = retry.parse()
    assert replayed.id == first.id
    assert replayed.choices[0].message.content == first.choices[0].message.content
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Name a fruit"}], max_tokens=8,
            extra_headers={"Idempotency-Key": key},
        )
    assert refused.value.code == "idempotency_key_reused"
