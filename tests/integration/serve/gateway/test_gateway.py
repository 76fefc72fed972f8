"""The gateway, the queue and the workers end to end: real redis-server, real vLLM, real processes.

Each test is something a client or an operator would notice: answers (plain,
streamed, queued as tasks), refusals (bad tokens, limits, over-long prompts),
and what survives failures (an engine down, a worker killed or stalled
mid-request, Redis restarted, SIGTERM).
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from tokenizers import Tokenizer

from llmfleet.serve.gateway.auth import mint
from llmfleet.serve.gateway.validation import load_template
from tests.integration.serve.gateway.gatewaystack import (
    PREFIX,
    GatedProxy,
    ReplyTap,
    Service,
    Stack,
    engine_proxy,
    http_status,
    metric_value,
    wait_for,
)
from tests.tools import LLMFLEET

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# Long (with ignore_eos): a request that is still streaming when a test acts, unless its engine is gated.
LONG_TOKENS = 1500


def chat(content: str = "Hello, how are you?", max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


def completion(prompt: str = "The quick brown fox", max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, **extra}


def sse_data(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield line[5:].strip()


def tokenizer(stack: Stack) -> Tokenizer:
    return Tokenizer.from_file(str(stack.vllm.model_dir / "tokenizer.json"))


def chat_tokens(stack: Stack, messages: list[dict[str, Any]]) -> int:
    """A chat's prompt tokens: the model's own template, rendered as vLLM renders it."""
    template = load_template("tiny", stack.vllm.model_dir)
    assert template is not None
    return len(tokenizer(stack).encode(template.render(messages, None), add_special_tokens=False).ids)


def running_on(client: redis.Redis, worker: Service) -> str | None:
    """The id of a request the worker is running now: its pending entries, then the job's state."""
    for lane in ("high", "normal", "low"):
        stream = f"{PREFIX}:q:tiny:{lane}"
        for pending in client.xpending_range(stream, "workers", "-", "+", 100, consumername=worker.name):
            for _entry_id, fields in client.xrange(stream, pending["message_id"], pending["message_id"]):
                if client.hget(f"{PREFIX}:job:{fields['id']}", "state") == "running":
                    return str(fields["id"])
    return None


def in_flight(client: redis.Redis) -> str:
    """What Redis says is in flight: for a failing wait's message."""
    lines = []
    for lane in ("high", "normal", "low"):
        stream = f"{PREFIX}:q:tiny:{lane}"
        lines.append(f"{stream}: {client.xlen(stream)} entries, pending {client.xpending(stream, 'workers')}")
    return "\n".join(lines)


def wait_running(stack: Stack, client: redis.Redis, worker: Service, call: Call | None = None) -> str:
    """Wait until worker runs a request; its id."""
    request_id: str = wait_for(
        lambda: running_on(client, worker),
        30,
        f"{worker.name} to start the request",
        context=lambda: f"{call.describe() if call else ''}\n{in_flight(client)}\n{stack.logs()}",
    )
    return request_id


def freeze_mid_request(client: redis.Redis, worker: Service, request_id: str) -> None:
    """SIGSTOP the worker and check that the request is still unanswered: "mid-request" for certain.

    Whatever the test does next (SIGKILL, SIGTERM + SIGCONT) then happens to a
    worker that holds an unfinished request, however slow or fast this machine is.
    """
    worker.signal(signal.SIGSTOP)
    job = client.hgetall(f"{PREFIX}:job:{request_id}")
    if job.get("state") != "running" or client.exists(f"{PREFIX}:result:{request_id}"):
        worker.signal(signal.SIGCONT)
        pytest.fail(f"request {request_id} finished before {worker.name} could be stopped mid-request: {job}")


class Call(threading.Thread):
    """One request on a thread, so the test can act while it is in flight."""

    def __init__(self, stack: Stack, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.stack, self.path, self.body, self.headers = stack, path, body, headers
        self.response: httpx.Response | None = None
        self.events: list[str] = []
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            with self.stack.client(timeout_s=120) as client:
                if self.body.get("stream"):
                    with client.stream("POST", self.path, json=self.body, headers=self.headers) as response:
                        self.response = response
                        for data in sse_data(response):
                            self.events.append(data)
                else:
                    self.response = client.post(self.path, json=self.body, headers=self.headers)
        except BaseException as error:  # reported by result()
            self.error = error

    def result(self, timeout_s: float = 120) -> httpx.Response:
        self.join(timeout_s)
        assert not self.is_alive(), "the request did not finish"
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response

    def describe(self) -> str:
        """The call's state, for a failing wait's message."""
        if self.error is not None:
            return f"call failed: {self.error!r}"
        if self.response is None:
            return "call: no response yet"
        body = "".join(self.events)[-300:] if self.body.get("stream") else self.response.text[:300]
        return f"call: {self.response.status_code} {body}"

    def text_chunks(self) -> list[str]:
        texts = []
        for data in self.events:
            if data == "[DONE]":
                continue
            for choice in json.loads(data).get("choices", []):
                text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                if text:
                    texts.append(text)
        return texts


def only_worker(stack: Stack, engines: list[str] | None = None) -> Service:
    """Stop every worker (a drain: exit 0) and start one fresh worker."""
    for worker in stack.live_workers():
        assert worker.stop() == 0, worker.log()[-2000:]
    worker = stack.start_worker(engines)
    stack.wait_gateway_ready()
    return worker


def long_request_frozen_on_a_new_worker(
    stack: Stack, *, stream: bool = False, engine: str | None = None
) -> tuple[Service, Call, str]:
    """One fresh worker, a long request in flight on it, the worker SIGSTOPped mid-request: (worker, call, id)."""
    worker = only_worker(stack, [engine] if engine else None)
    extra: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    call = Call(stack, COMPLETIONS, completion(max_tokens=LONG_TOKENS, ignore_eos=True, **extra), stack.auth())
    with stack.redis.client() as client:
        request_id = wait_running(stack, client, worker, call)
        if stream:  # mid-stream on the worker's side: chunks published, far from done
            job_key = f"{PREFIX}:job:{request_id}"
            wait_for(
                lambda: int(client.hget(job_key, "partial_tokens") or 0) >= 20,
                30,
                "the first streamed tokens",
                context=lambda: f"job: {client.hgetall(job_key)}\n{stack.logs()}",
            )
        freeze_mid_request(client, worker, request_id)
    return worker, call, request_id


def wait_metric(service: Service, name: str, value: float, timeout_s: float = 10, **labels: str) -> None:
    """A worker counts a result once Redis has answered it, which can be just after the client got the answer."""
    wait_for(
        lambda: metric_value(service.metrics(), name, **labels) == value,
        timeout_s,
        f"{name}{labels} on {service.name} to be {value}",
        context=lambda: f"it is {metric_value(service.metrics(), name, **labels)}",
    )


# -- answers -------------------------------------------------------------------


def test_chat_and_completion_answer_through_the_gateway(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post(CHAT, json=chat(), headers=stack.auth())
        assert response.status_code == 200, response.text
        body = response.json()
        request_id = response.headers["x-request-id"]
        assert body["id"] == f"chatcmpl-{request_id}"
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert 0 < body["usage"]["completion_tokens"] <= 8
        # The gateway counts prompt tokens with the model's own tokenizer and chat template, as vLLM does.
        hello = [{"role": "user", "content": "Hello, how are you?"}]
        assert body["usage"]["prompt_tokens"] == chat_tokens(stack, hello)
        assert response.headers["x-ratelimit-limit-requests"] == "100000"
        assert int(response.headers["x-ratelimit-remaining-tokens"]) < 100_000_000

        response = client.post(COMPLETIONS, json=completion(), headers=stack.auth())
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "text_completion"
        assert isinstance(body["choices"][0]["text"], str)
        expected = len(tokenizer(stack).encode("The quick brown fox").ids)
        assert body["usage"]["prompt_tokens"] == expected


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_streamed_completion_arrives_token_by_token(stack: Stack, path: str) -> None:
    body = (chat if path == CHAT else completion)(
        max_tokens=24, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    call = Call(stack, path, body, stack.auth())
    response = call.result()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert call.events[-1] == "[DONE]"
    chunks = [json.loads(data) for data in call.events[:-1]]
    assert all(chunk["model"] == "tiny" for chunk in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    # Chunk by chunk as the engine sends them, not one blob at the end. Not one chunk per token:
    # vLLM merges a request's pending deltas when its API server falls behind the engine (vLLM 0.32,
    # v1/engine/output_processor.py: RequestOutputCollector.put), which a
    # loaded 2-core machine makes common (9 chunks of text for 24 tokens seen in a full test run).
    assert len(call.text_chunks()) >= 2
    finish = [choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
    assert finish == ["length"]
    # The stored result (GET /v1/tasks/{id}) is the same text the client saw.
    request_id = response.headers["x-request-id"]
    with stack.client() as client:
        task = client.get(f"/v1/tasks/{request_id}", headers=stack.auth()).json()
    assert task["status"] == "completed"
    choice = task["result"]["choices"][0]
    stored = choice["message"]["content"] if path == CHAT else choice["text"]
    assert stored == "".join(call.text_chunks())


def test_task_mode_answers_202_then_the_result(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post(CHAT, json=chat(), headers={**stack.auth(), "Prefer": "respond-async"})
        assert response.status_code == 202, response.text
        task = response.json()
        assert response.headers["location"] == task["url"] == f"/v1/tasks/{task['id']}"

        def finished() -> dict[str, Any] | None:
            status = client.get(task["url"], headers=stack.auth()).json()
            return status if status["status"] in ("completed", "failed") else None

        status = wait_for(finished, 30, "the task to finish", interval_s=0.1)
        assert status["status"] == "completed"
        assert status["http_status"] == 200
        assert status["result"]["object"] == "chat.completion"
        # Another subject does not see it at all.
        assert client.get(task["url"], headers=stack.auth("mallory")).status_code == 404
        assert (
            client.post(CHAT, json=chat(stream=True), headers={**stack.auth(), "Prefer": "respond-async"}).status_code
            == 400
        )


def test_models_probes_metrics_and_openapi(stack: Stack) -> None:
    with stack.client() as client:
        models = client.get("/v1/models", headers=stack.auth()).json()
        assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("tiny", 2048)]
        assert client.get("/v1/models", headers=stack.auth(models=["other"])).json()["data"] == []
        assert client.get("/healthz").status_code == 200
        # The API port does not serve the ops routes (nor list them); the ops listener does.
        assert client.get("/readyz").status_code == 404
        assert client.get("/metrics").status_code == 404
        spec = client.get("/openapi.json").json()
        assert {CHAT, COMPLETIONS, "/v1/models", "/v1/tasks/{task_id}"} <= set(spec["paths"])
        assert not {"/readyz", "/metrics"} & set(spec["paths"])
    with httpx.Client(base_url=stack.ops_url, timeout=10, trust_env=False) as ops:
        assert ops.get("/healthz").status_code == 200
        ready = ops.get("/readyz")
        assert ready.status_code == 200 and ready.json()["healthy_engines"] >= 1
        metrics = ops.get("/metrics").text
        assert 'llmfleet_gateway_requests_total{method="GET",route="/v1/models",status="200"}' in metrics
        assert ops.get("/v1/models", headers=stack.auth()).status_code == 404
    worker_metrics = stack.live_workers()[0].metrics()
    assert 'llmfleet_queue_depth{lane="normal",model="tiny"}' in worker_metrics
    assert metric_value(worker_metrics, "llmfleet_engine_up", engine=stack.vllm.url) == 1


# -- refusals ------------------------------------------------------------------


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _unsigned(stack: Stack) -> str:
    """alg "none": a token with claims a real one would have and no signature."""
    now = int(time.time())
    claims = {"sub": "alice", "iss": "llmfleet", "aud": "llmfleet", "exp": now + 600, "models": "*"}
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."


BAD_TOKENS = {
    "expired": lambda s: s.token(now=time.time() - 7200, ttl_s=3600),
    "wrong signature": lambda s: mint(subject="alice", key="another-secret-that-is-long-enough-0123456789"),
    "alg none": _unsigned,
    "wrong audience": lambda s: s.token(audience="someone-else"),
    "wrong issuer": lambda s: s.token(issuer="evil"),
    "not yet valid": lambda s: s.token(now=time.time() + 3600),
    "garbage": lambda s: "not-a-jwt",
}


@pytest.mark.parametrize("case", [*BAD_TOKENS, "missing"])
def test_bad_tokens_get_401(stack: Stack, case: str) -> None:
    headers = {} if case == "missing" else {"Authorization": f"Bearer {BAD_TOKENS[case](stack)}"}
    with stack.client() as client:
        response = client.post(CHAT, json=chat(), headers=headers)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith('Bearer realm="llmfleet"')
    assert response.json()["error"]["type"] == "authentication_error"


def test_a_model_the_token_may_not_use_gets_403(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post(CHAT, json=chat(), headers=stack.auth(models=["some-other-model"]))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "model_not_allowed"


def test_a_rate_limit_hit_gets_429_with_retry_after(stack: Stack) -> None:
    headers = {**stack.auth(f"limited-{uuid.uuid4().hex[:8]}", tier="tight"), "Prefer": "respond-async"}
    with stack.client() as client:
        answers = [client.post(COMPLETIONS, json=completion(), headers=headers) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [202, 202, 429], answers[-1].text
    refused = answers[-1]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.json()["error"]["code"] == "requests_limit_exceeded"
    assert answers[1].headers["x-ratelimit-remaining-requests"] == "0"


def test_an_over_long_prompt_gets_400_with_both_numbers(stack: Stack) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 300
    prompt_tokens = len(tokenizer(stack).encode(prompt).ids)
    assert prompt_tokens > 2048
    with stack.client() as client:
        response = client.post(COMPLETIONS, json=completion(prompt, max_tokens=16), headers=stack.auth())
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert f"prompt is {prompt_tokens} tokens" in error["message"]
        assert "max_tokens is 16" in error["message"] and "2048" in error["message"]
        assert (error["prompt_tokens"], error["max_tokens"], error["max_model_len"]) == (prompt_tokens, 16, 2048)
        assert response.headers["x-request-id"]

        # A prompt that fits alone but not with max_tokens: served, its answer cut at the context's end,
        # as vLLM 0.32 does (the engine clamps max_tokens to the room the prompt leaves).
        text = "The quick brown fox. " * 80
        fits = chat_tokens(stack, [{"role": "user", "content": text}])
        response = client.post(
            CHAT, json=chat(text, max_tokens=2048 - fits + 1, ignore_eos=True), headers=stack.auth(), timeout=300
        )
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (fits, 2048 - fits)

        response = client.post(COMPLETIONS, json=completion(max_tokens=5000), headers=stack.auth())
        assert response.status_code == 400 and "cap of 4096" in response.json()["error"]["message"]
        response = client.post(COMPLETIONS, content=b"x" * (2 << 20), headers=stack.auth())
        assert response.status_code == 413


# -- failures survived ------------------------------------------------------------


def test_an_engine_down_is_served_by_the_other_engine(
    stack: Stack, failing_engine: tuple[str, Any], closed_port: int
) -> None:
    url, hits = failing_engine
    dead = f"http://127.0.0.1:{closed_port}"
    for worker in stack.live_workers():
        assert worker.stop() == 0
    # The failing engine first: on a tie the pool picks engines in turn, so it is tried.
    worker = stack.start_worker(engines=[url, dead, stack.vllm.url], eject_after="1")
    stack.wait_gateway_ready()
    try:
        calls = [Call(stack, COMPLETIONS, completion(max_tokens=4), stack.auth()) for _ in range(6)]
        assert [call.result().status_code for call in calls] == [200] * 6
        assert hits["/v1/completions"] >= 1, "the failing engine was never tried"
        metrics = worker.metrics()
        assert metric_value(metrics, "llmfleet_worker_errors_total", reason="engine_5xx") >= 1
        assert metric_value(metrics, "llmfleet_engine_ejections_total", engine=url) >= 1
        assert metric_value(metrics, "llmfleet_engine_up", engine=dead) == 0
        assert metric_value(metrics, "llmfleet_engine_up", engine=stack.vllm.url) == 1
    finally:
        assert worker.stop() == 0
        stack.ensure_one_worker()


def test_kill_9_of_a_worker_mid_request_still_answers_exactly_once(
    stack: Stack, tap: ReplyTap, gated_engine: tuple[str, threading.Event]
) -> None:
    # The victim's engine answers only when released (GatedProxy): it is mid-request for certain when killed.
    victim, call, request_id = long_request_frozen_on_a_new_worker(stack, engine=gated_engine[0])
    victim.signal(signal.SIGKILL)
    assert victim.process is not None and victim.process.wait(10) == -signal.SIGKILL
    rescuer = stack.start_worker()
    response = call.result()
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == request_id
    assert response.json()["usage"]["completion_tokens"] == LONG_TOKENS
    with stack.redis.client() as client:
        job = client.hgetall(f"{PREFIX}:job:{request_id}")
        assert (job["attempts"], job["worker"]) == ("2", rescuer.name)
        assert not [e for _, e in client.xrange(f"{PREFIX}:dlq") if e.get("id") == request_id]
    wait_for(lambda: tap.finals[request_id] >= 1, 5, "the answer on the reply stream")
    assert tap.finals[request_id] == 1
    assert metric_value(rescuer.metrics(), "llmfleet_worker_reclaimed_total") >= 1
    wait_metric(rescuer, "llmfleet_worker_results_total", 1, outcome="answer")
    stack.ensure_one_worker()


def test_a_stalled_worker_that_wakes_up_does_not_answer_twice(
    stack: Stack, tap: ReplyTap, gated_engine: tuple[str, threading.Event]
) -> None:
    """Processed twice, answered once: the first result wins, the late one is discarded."""
    url, release = gated_engine
    victim, call, request_id = long_request_frozen_on_a_new_worker(stack, engine=url)
    try:
        rescuer = stack.start_worker()
        response = call.result()
        assert response.status_code == 200
    finally:
        release.set()
        victim.signal(signal.SIGCONT)
    # The victim finishes its own copy of the request later and tries to deliver it.
    wait_metric(victim, "llmfleet_worker_results_total", 1, outcome="duplicate")
    assert tap.finals[request_id] == 1
    wait_metric(rescuer, "llmfleet_worker_results_total", 1, outcome="answer")
    stack.ensure_one_worker()


def test_a_stream_survives_a_worker_kill_and_continues_where_it_stopped(
    stack: Stack, tap: ReplyTap, stalling_engine: str
) -> None:
    # The victim's engine stalls after 40 events: it has published text and cannot finish before it is killed.
    victim, call, request_id = long_request_frozen_on_a_new_worker(stack, stream=True, engine=stalling_engine)
    victim.signal(signal.SIGKILL)
    rescuer = stack.start_worker()
    response = call.result()
    assert response.status_code == 200
    assert call.events[-1] == "[DONE]"
    assert not [data for data in call.events if '"error"' in data]
    usage = json.loads(call.events[-2])["usage"]
    assert usage["completion_tokens"] == LONG_TOKENS
    assert response.headers["x-request-id"] == request_id
    with stack.client() as client:
        task = client.get(f"/v1/tasks/{request_id}", headers=stack.auth()).json()
    # One coherent text: what the client saw is exactly the stored answer, attempt 2 continuing attempt 1.
    assert task["result"]["choices"][0]["text"] == "".join(call.text_chunks())
    assert task["attempts"] == 2, f"{task}\n{stack.logs()}"
    wait_for(lambda: tap.finals[request_id] >= 1, 5, "the answer on the reply stream")
    assert tap.finals[request_id] == 1
    assert metric_value(rescuer.metrics(), "llmfleet_worker_reclaimed_total") >= 1
    stack.ensure_one_worker()


def _open_request(stack: Stack, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a request on a raw socket, so the test decides exactly when the client goes away."""
    content = json.dumps(body).encode()
    port = int(stack.url.rsplit(":", 1)[1])
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {stack.token()}\r\nContent-Length: {len(content)}\r\n\r\n".encode()
        + content
    )
    return connection


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (COMPLETIONS, completion(max_tokens=2000, ignore_eos=True)),
        (COMPLETIONS, completion(max_tokens=2000, ignore_eos=True, stream=True)),
        # The named-event APIs' streams go the same way.
        ("/v1/responses", {"model": "tiny", "input": "Hi", "max_output_tokens": 2000, "stream": True}),
        (
            "/v1/messages",
            {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2000, "stream": True},
        ),
    ],
    ids=["sync", "stream", "responses-stream", "messages-stream"],
)
def test_a_client_that_goes_away_cancels_the_engine_request(
    stack: Stack, path: str, body: dict[str, Any], stalling_engine: str
) -> None:
    # The worker's engine stalls (StallingProxy): the request ends only by being cancelled, however long a
    # loaded Redis (appendfsync always) takes to pass the cancel on. A real engine would finish first.
    worker = only_worker(stack, [stalling_engine])
    before = metric_value(worker.metrics(), "llmfleet_worker_cancelled_total")
    connection = _open_request(stack, path, body)
    with stack.redis.client() as client:
        request_id = wait_running(stack, client, worker)
    connection.close()
    wait_metric(worker, "llmfleet_worker_cancelled_total", before + 1, timeout_s=30)
    # The worker counts a cancel once its 499 is stored: the task reads as cancelled now, not eventually.
    with stack.client() as client:
        task = client.get(f"/v1/tasks/{request_id}", headers=stack.auth()).json()
    assert task["status"] == "cancelled" and task["http_status"] == 499, task
    assert worker.stop() == 0
    stack.ensure_one_worker()


def test_a_stopped_gateway_cancels_the_requests_it_abandons(stack: Stack, stalling_engine: str) -> None:
    """SIGTERM: past its grace period (3 s here) the gateway gives up on a request still waiting and marks it
    cancelled, so the worker stops the engine call instead of computing an answer nobody will read."""
    worker = only_worker(stack, [stalling_engine])
    before = metric_value(worker.metrics(), "llmfleet_worker_cancelled_total")
    connection = _open_request(stack, COMPLETIONS, completion(max_tokens=2000, ignore_eos=True))
    try:
        with stack.redis.client() as client:
            request_id = wait_running(stack, client, worker)
        gateway = stack.gateway
        assert gateway is not None and gateway.process is not None
        gateway.signal(signal.SIGTERM)
        # uvicorn ends by raising again the signal it caught: the exit status of a SIGTERM, not of a crash.
        assert gateway.process.wait(30) == -signal.SIGTERM, gateway.log()[-3000:]
        assert "Cancel 1 running task(s), timeout graceful shutdown exceeded" in gateway.log()
        wait_metric(worker, "llmfleet_worker_cancelled_total", before + 1, timeout_s=30)
    finally:
        connection.close()
        stack.start_gateway()
        stack.wait_gateway_ready()
    with stack.client() as client:
        task = client.get(f"/v1/tasks/{request_id}", headers=stack.auth()).json()
    assert task["status"] == "cancelled" and task["http_status"] == 499, task
    assert worker.stop() == 0
    stack.ensure_one_worker()


def test_sigterm_drains_in_flight_work_before_exiting(stack: Stack, gated_engine: tuple[str, threading.Event]) -> None:
    url, release = gated_engine
    worker = only_worker(stack, [url])
    call = Call(stack, COMPLETIONS, completion(max_tokens=LONG_TOKENS, ignore_eos=True), stack.auth())
    with stack.redis.client() as client:
        wait_running(stack, client, worker, call)  # and it stays running: the gate holds the engine's answer
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "draining: 1 requests in flight" in worker.log(), 10, f"{worker.name} to start draining")
    assert worker.alive(), "the worker exited with a request in flight"
    release.set()
    response = call.result()
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == LONG_TOKENS
    assert worker.process is not None and worker.process.wait(30) == 0
    stack.ensure_one_worker()


def test_redis_restarted_with_aof_loses_no_accepted_request(
    stack: Stack, gated_engine: tuple[str, threading.Event]
) -> None:
    # The worker's engine answers only when released (GatedProxy): every request is still in flight, held by
    # the worker, when Redis goes away, however fast the engine.
    url, release = gated_engine
    worker = only_worker(stack, [url])
    headers = {**stack.auth(), "Prefer": "respond-async"}
    with stack.client() as client:
        accepted = [
            client.post(COMPLETIONS, json=completion(max_tokens=600, ignore_eos=True), headers=headers)
            for _ in range(12)
        ]
    assert [response.status_code for response in accepted] == [202] * 12
    ids = [response.json()["id"] for response in accepted]
    # And one client waiting synchronously across the restart.
    waiting = Call(stack, CHAT, chat(max_tokens=LONG_TOKENS, ignore_eos=True), stack.auth())
    lane = f"{PREFIX}:q:tiny:normal"
    with stack.redis.client() as client:
        wait_for(
            lambda: client.xpending(lane, "workers")["pending"] == 13,
            30,
            "all 13 requests to be taken by the worker",
            context=lambda: f"{waiting.describe()}\n{in_flight(client)}\n{stack.logs()}",
        )
        assert not [i for i in ids if client.exists(f"{PREFIX}:result:{i}")], "answered through a closed gate?"
    stack.redis.kill()
    # While Redis is down nothing is accepted: a clear 503 with Retry-After, not a hang or a 500.
    wait_for(lambda: http_status(f"{stack.ops_url}/readyz") == 503, 10, "the gateway to see Redis gone")
    with stack.client() as client:
        refused = client.post(COMPLETIONS, json=completion(), headers=headers)
    assert refused.status_code == 503 and refused.headers["retry-after"], refused.text
    stack.redis.start()
    release.set()

    def all_done() -> list[dict[str, Any]] | None:
        statuses = []
        with stack.client() as client:
            for task_id in ids:
                response = client.get(f"/v1/tasks/{task_id}", headers=stack.auth())
                if response.status_code != 200 or response.json()["status"] in ("queued", "running"):
                    return None
                statuses.append(response.json())
        return statuses

    statuses = wait_for(all_done, 90, "every accepted task to finish after the restart", interval_s=0.2)
    assert [status["status"] for status in statuses] == ["completed"] * 12
    assert all(status["result"]["usage"]["completion_tokens"] == 600 for status in statuses)
    response = waiting.result()
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == LONG_TOKENS
    assert http_status(f"{stack.ops_url}/readyz") == 200
    assert worker.stop() == 0
    stack.ensure_one_worker()


def _rotation(stack: Stack, action: str, *engines: str) -> subprocess.Popen[str]:
    """`llmfleet worker drain|undrain`, with the stack's Redis settings, running in the background."""
    command = [*LLMFLEET, "worker", action, *[arg for url in engines for arg in ("--engine", url)], "--timeout", "60"]
    env = {**stack.base_env, "LLMFLEET_REDIS_USERNAME": "worker"}  # as the engines playbook runs it: in a worker
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _engine_report(client: redis.Redis, worker: Service, url: str) -> dict[str, Any]:
    report = json.loads(client.get(f"{PREFIX}:engines:{worker.name}") or "{}")
    return next((engine for engine in report.get("engines", []) if engine["url"] == url), {})


def test_a_drained_engine_gets_no_new_requests_and_the_drain_waits_for_its_running_ones(stack: Stack) -> None:
    # Two engines whose answers wait for the test (GatedProxy): a request stays running on each until released.
    hits_a: Counter[str] = Counter()
    hits_b: Counter[str] = Counter()
    with (
        engine_proxy(GatedProxy, upstream=stack.vllm.url, hits=hits_a) as (engine_a, release_a),
        engine_proxy(GatedProxy, upstream=stack.vllm.url, hits=hits_b) as (engine_b, release_b),
        stack.redis.client() as client,
    ):
        worker = only_worker(stack, [engine_a, engine_b])
        calls = [Call(stack, COMPLETIONS, completion(), stack.auth())]
        wait_for(lambda: sum(hits_a.values()) + sum(hits_b.values()) == 1, 30, "the first request on an engine")
        calls.append(Call(stack, COMPLETIONS, completion(), stack.auth()))
        # Least outstanding requests first: one request on each engine.
        wait_for(lambda: (sum(hits_a.values()), sum(hits_b.values())) == (1, 1), 30, "one request on each engine")

        unknown = _rotation(stack, "drain", "http://127.0.0.1:1")
        output, _ = unknown.communicate(timeout=60)
        assert unknown.returncode == 1 and "no live worker sends requests to http://127.0.0.1:1" in output, output
        assert client.smembers(f"{PREFIX}:drained") == set(), "a refused drain changed nothing"

        drain = _rotation(stack, "drain", engine_a)
        wait_for(
            lambda: _engine_report(client, worker, engine_a).get("drained"), 30, f"{worker.name} to drain {engine_a}"
        )
        assert _engine_report(client, worker, engine_a)["outstanding"] == 1
        assert drain.poll() is None, "the drain ended while a request still ran on the engine"
        # A new request goes to the engine that is not drained.
        calls.append(Call(stack, COMPLETIONS, completion(), stack.auth()))
        wait_for(lambda: sum(hits_b.values()) == 2, 30, "the third request on the engine not drained")
        assert sum(hits_a.values()) == 1

        release_a.set()
        output, _ = drain.communicate(timeout=60)
        assert drain.returncode == 0, output
        assert f"{engine_a}: 1 workers know it, 1 drained it, 0 requests running" in output

        undrain = _rotation(stack, "undrain", engine_a)
        output, _ = undrain.communicate(timeout=60)
        assert undrain.returncode == 0, output
        assert f"{engine_a}: 1 workers know it, 0 drained it" in output and "1 see it serving" in output
        assert client.smembers(f"{PREFIX}:drained") == set()
        release_b.set()
        assert [call.result().status_code for call in calls] == [200, 200, 200]
        assert worker.stop() == 0
    stack.ensure_one_worker()
