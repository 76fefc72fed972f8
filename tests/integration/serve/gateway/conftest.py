"""Fixtures for the gateway tests: one real stack (Redis, gateway, worker) per test package.

Everything listens on 127.0.0.1 and talks to the session's real vLLM (the
`vllm_server` fixture, serving the tiny model as "tiny"). Redis persists with
AOF and appendfsync always, and only ACL users whose password is in a 0600
file can connect (the password is in redis.conf, never on a command line): the
gateway and the workers as `gateway` and `worker`, with exactly the rights the
redis role grants them, the tests themselves as `llmfleet`.
Tests that kill or replace workers leave one running worker behind.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from llmfleet.lab.vllm_cpu import VllmServer
from tests.integration.serve.gateway.gatewaystack import (
    CLAIM_IDLE_MS,
    GatedProxy,
    ReplyTap,
    Stack,
    StallingProxy,
    StubEngine,
    engine_proxy,
    running_stack,
    serving,
)
from tests.tools import free_loopback_port


@pytest.fixture(scope="package")
def stack(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("gateway-stack"),
        vllm_server,
        LLMFLEET_QUEUE_CLAIM_IDLE_MS=str(CLAIM_IDLE_MS),
        LLMFLEET_QUEUE_ENGINE_STALE_S="10",
    ) as started:
        yield started


@pytest.fixture
def tap(stack: Stack) -> Iterator[ReplyTap]:
    reply_tap = ReplyTap(stack.redis)
    try:
        yield reply_tap
    finally:
        reply_tap.stop()


@pytest.fixture
def failing_engine() -> Iterator[tuple[str, Counter[str]]]:
    """(url, hits by path) of an engine that passes health checks and answers 503 to every request."""
    hits: Counter[str] = Counter()
    with serving(StubEngine, hits=hits) as url:
        yield url, hits


@pytest.fixture
def closed_port() -> int:
    """A loopback port that was bound once and is closed now: connections are refused."""
    return free_loopback_port()


@pytest.fixture
def stalling_engine(vllm_server: VllmServer) -> Iterator[str]:
    """The URL of the real vLLM behind StallingProxy: a POST's stream stops after 40 events and hangs."""
    with engine_proxy(StallingProxy, upstream=vllm_server.url, events=40) as (url, _release):
        yield url


@pytest.fixture
def gated_engine(vllm_server: VllmServer) -> Iterator[tuple[str, threading.Event]]:
    """The real vLLM behind GatedProxy: (URL, release); every answer waits until release is set."""
    with engine_proxy(GatedProxy, upstream=vllm_server.url) as gate:
        yield gate
