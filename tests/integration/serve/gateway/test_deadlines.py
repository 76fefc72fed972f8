"""Deadlines end a request with a 504, never a hang (failure mode 13).

A stack of its own (its own Redis, gateway and worker) with short timeouts:
the whole request 8 s (LLMFLEET_QUEUE_REQUEST_TIMEOUT_S), the wait for a
first worker 2 s (LLMFLEET_QUEUE_QUEUE_TIMEOUT_S), which gateway and worker
share, as the roles set them. The engine is the real vLLM behind GatedProxy,
a STAND-IN slow link that holds every answer until the test releases it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llmfleet.lab.vllm_cpu import VllmServer
from tests.integration.serve.gateway.gatewaystack import GatedProxy, Stack, engine_proxy, running_stack, wait_for

pytestmark = pytest.mark.vllm

REQUEST_TIMEOUT_S = 8
QUEUE_TIMEOUT_S = 2
CHAT = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "Count to three"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def short_stack(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("deadline-stack"),
        vllm_server,
        LLMFLEET_QUEUE_REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S),
        LLMFLEET_QUEUE_QUEUE_TIMEOUT_S=str(QUEUE_TIMEOUT_S),
    ) as stack:
        yield stack


def _only_worker_behind_a_gate(stack: Stack, gate_url: str) -> None:
    """Replace the stack's workers by one that runs a single request at a time, on the gated engine."""
    for worker in stack.live_workers():
        worker.stop()
    stack.start_worker(engines=[gate_url], concurrency="1")
    stack.wait_gateway_ready()


def _send(stack: Stack, answers: dict[str, Any], name: str) -> threading.Thread:
    def send() -> None:
        started = time.monotonic()
        with stack.client(timeout_s=120) as client:
            response = client.post(CHAT, json=BODY, headers=stack.auth())
        answers[name] = (response, time.monotonic() - started)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _gateway_waiting(stack: Stack) -> float:
    with httpx.Client(base_url=stack.ops_url, timeout=5, trust_env=False) as ops:
        text = ops.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("llmfleet_gateway_waiting "):
            return float(line.split()[1])
    return 0.0


def test_a_request_past_its_whole_deadline_gets_a_504(short_stack: Stack) -> None:
    with engine_proxy(GatedProxy, upstream=short_stack.vllm.url) as (gate_url, _release):
        _only_worker_behind_a_gate(short_stack, gate_url)
        answers: dict[str, Any] = {}
        _send(short_stack, answers, "held").join(timeout=REQUEST_TIMEOUT_S + 60)
    response, elapsed = answers["held"]
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["type"] == "timeout", error
    # Ended by its deadline (8 s), not by the client's patience or a hang.
    assert REQUEST_TIMEOUT_S - 1 <= elapsed < REQUEST_TIMEOUT_S + 30, elapsed


def test_a_request_that_waits_past_its_queue_timeout_gets_a_504(short_stack: Stack) -> None:
    with engine_proxy(GatedProxy, upstream=short_stack.vllm.url) as (gate_url, release):
        _only_worker_behind_a_gate(short_stack, gate_url)
        answers: dict[str, Any] = {}
        first = _send(short_stack, answers, "first")
        wait_for(lambda: _gateway_waiting(short_stack) >= 1, 30, "the first request to be waiting")
        # The only worker slot is held by the first request: the second waits in the queue.
        second = _send(short_stack, answers, "second")
        wait_for(lambda: _gateway_waiting(short_stack) >= 2, 30, "the second request to be waiting")
        time.sleep(QUEUE_TIMEOUT_S + 1)  # the queue timeout is the condition under test: let it pass
        release.set()
        first.join(timeout=60)
        second.join(timeout=60)
    first_response, _ = answers["first"]
    second_response, second_elapsed = answers["second"]
    assert first_response.status_code == 200, first_response.text
    assert second_response.status_code == 504, second_response.text
    assert second_response.json()["error"]["code"] == "queue_timeout", second_response.text
    assert second_elapsed < REQUEST_TIMEOUT_S, second_elapsed  # answered when taken, not at the deadline
