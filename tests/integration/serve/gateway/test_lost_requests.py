"""A Redis that lost its latest writes: the gateway tells its waiters at once (503 request_lost), not at the deadline.

Its own stack: a real redis-server, the real gateway and worker processes,
and a STAND-IN engine (HoldingEngine) that holds every request until the test
releases it, so each request is waiting for certain when Redis goes. The
gateway's tokenizer is the session's real tiny model.

"Lost its writes" is made deterministic: SIGKILL, the AOF directory removed,
start again: every write is lost, as a Redis without persistence loses them,
or one with `appendfsync everysec` loses its last second on a host crash.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmfleet.lab.vllm_cpu import VllmServer
from tests.integration.serve.gateway.gatewaystack import (
    RedisServer,
    Stack,
    StubEngine,
    http_status,
    metric_value,
    running_stack,
    serving,
    wait_for,
)

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
POLL_S = 1.0  # the stack's LLMFLEET_GATEWAY_RESULT_POLL_S
DEADLINE_S = 120  # queue + request timeout below: what a waiter would hang for without the check


class HoldingEngine(StubEngine):
    """A STAND-IN engine: healthy to probes (StubEngine's GETs); every POST is held until `release` is set."""

    release: threading.Event

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.hits[self.path] += 1
        self.release.wait()
        message = {"role": "assistant", "content": "held"}
        body = {
            "id": "stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "tiny",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
        self._reply(200, body)


@pytest.fixture(scope="module")
def held(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Any]]:
    """(the stack, (the engine's release event, its POST count)); the worker's engine holds every request."""
    release = threading.Event()
    hits: Counter[str] = Counter()
    with (
        serving(HoldingEngine, release=release, hits=hits) as engine_url,
        running_stack(
            tmp_path_factory.mktemp("lost-stack"),
            vllm_server,
            engines=[engine_url],
            LLMFLEET_QUEUE_REQUEST_TIMEOUT_S=str(DEADLINE_S // 2),
            LLMFLEET_QUEUE_QUEUE_TIMEOUT_S=str(DEADLINE_S // 2),
        ) as stack,
    ):
        try:
            yield stack, (release, hits)
        finally:
            release.set()


def chat(content: str) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 8}


class Call:
    """One request in a thread: its response (and, for a stream, its lines) and when it ended."""

    def __init__(self, stack: Stack, body: dict[str, Any], headers: dict[str, str]) -> None:
        self.stack, self.body, self.headers = stack, body, headers
        self.response: httpx.Response | None = None
        self.lines: list[str] = []
        self.ended = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with httpx.Client(base_url=self.stack.url, timeout=DEADLINE_S + 30, trust_env=False) as client:
                if self.body.get("stream"):
                    with client.stream("POST", CHAT, json=self.body, headers=self.headers) as response:
                        self.response = response
                        self.lines = [line for line in response.iter_lines() if line]
                else:
                    self.response = client.post(CHAT, json=self.body, headers=self.headers)
        except BaseException as error:  # reported by result()
            self.error = error
        self.ended = time.monotonic()

    def result(self, timeout_s: float) -> httpx.Response:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"no answer in {timeout_s:.0f} s"
        assert self.error is None, repr(self.error)
        assert self.response is not None
        return self.response


def lose_everything(redis_server: RedisServer) -> None:
    """SIGKILL and start again without the AOF: every write is gone, as without persistence."""
    redis_server.kill()
    shutil.rmtree(redis_server.dir / "appendonlydir", ignore_errors=True)
    redis_server.start()


def test_waiters_whose_job_redis_lost_get_a_retryable_error_within_a_few_polls(held: tuple[Stack, Any]) -> None:
    stack, (release, hits) = held
    assert stack.gateway is not None
    release.clear()
    before = hits["/v1/chat/completions"]
    with httpx.Client(base_url=stack.url, timeout=30, trust_env=False) as client:
        task = client.post(CHAT, json=chat("a task"), headers={**stack.auth(), "Prefer": "respond-async"})
    assert task.status_code == 202, task.text
    sync = Call(stack, chat("a sync request"), stack.auth())
    stream = Call(stack, {**chat("a stream"), "stream": True}, stack.auth())
    wait_for(lambda: hits["/v1/chat/completions"] - before >= 3, 30, "the three requests to reach the engine")

    lose_everything(stack.redis)
    restarted = time.monotonic()
    response = sync.result(timeout_s=30)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "request_lost"
    assert response.json()["error"]["type"] == "server_error"
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.headers["retry-after"] == "1"
    assert response.headers["x-request-id"]
    # Within a few polls of the restart (the gateway reconnects first), nowhere near the deadline.
    assert sync.ended - restarted < 10 * POLL_S, sync.ended - restarted

    streamed = stream.result(timeout_s=30)
    assert streamed.status_code == 200
    assert stream.lines[-1] == "data: [DONE]"
    error = json.loads(stream.lines[-2].removeprefix("data: "))
    assert error["error"]["code"] == "request_lost", stream.lines
    assert stream.ended - restarted < 10 * POLL_S

    with httpx.Client(base_url=stack.url, timeout=30, trust_env=False) as client:
        status = client.get(f"/v1/tasks/{task.json()['id']}", headers=stack.auth())
        assert status.status_code == 200, status.text
        assert status.json()["status"] == "failed"
        assert status.json()["http_status"] == 503
        assert status.json()["result"]["error"]["code"] == "request_lost"
        # Another subject still sees nothing.
        other = client.get(f"/v1/tasks/{task.json()['id']}", headers=stack.auth("mallory"))
        assert other.status_code == 404

    metrics = stack.gateway.metrics()
    for mode in ("sync", "stream", "task"):
        assert metric_value(metrics, "llmfleet_gateway_lost_total", mode=mode) == 1, mode

    # The held attempts end now; their answers find no job to deliver to. The fleet serves again.
    release.set()
    wait_for(lambda: http_status(f"{stack.ops_url}/readyz") == 200, 30, "the gateway to be ready again")
    with httpx.Client(base_url=stack.url, timeout=60, trust_env=False) as client:
        again = client.post(CHAT, json=chat("sent again"), headers=stack.auth())
        assert again.status_code == 200, f"{again.text}\n{stack.logs()}"
        assert again.json()["choices"][0]["message"]["content"] == "held"
        # Whatever the worker that held the task's attempt stores now, a task that read as failed stays failed.
        status = client.get(f"/v1/tasks/{task.json()['id']}", headers=stack.auth())
    assert status.json()["status"] == "failed", status.text


def test_a_redis_that_is_only_unreachable_loses_nothing_and_the_answer_still_comes(held: tuple[Stack, Any]) -> None:
    stack, (release, hits) = held
    assert stack.gateway is not None
    release.clear()
    lost_before = metric_value(stack.gateway.metrics(), "llmfleet_gateway_lost_total", mode="sync")
    before = hits["/v1/chat/completions"]
    sync = Call(stack, chat("across an outage"), stack.auth())
    wait_for(lambda: hits["/v1/chat/completions"] - before >= 1, 30, "the request to reach the engine")
    # Persisted (appendfsync always): down for several polls, then back with everything.
    stack.redis.kill()
    time.sleep(5 * POLL_S)
    assert sync.thread.is_alive(), "answered while Redis was down"
    stack.redis.start()
    time.sleep(3 * POLL_S)
    assert sync.thread.is_alive(), "answered before the engine did"
    release.set()
    response = sync.result(timeout_s=60)
    assert response.status_code == 200, f"{response.text}\n{stack.logs()}"
    assert response.json()["choices"][0]["message"]["content"] == "held"
    assert metric_value(stack.gateway.metrics(), "llmfleet_gateway_lost_total", mode="sync") == lost_before
