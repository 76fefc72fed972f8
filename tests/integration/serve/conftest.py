"""Fixtures shared by the queue's script tests (tests/integration/serve/gateway/test_queue_scripts.py,
tests/integration/serve/queue/): a redis-server of their own per module, and anyio on asyncio."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.integration.serve.gateway.gatewaystack import RedisServer
from tests.tools import free_loopback_port


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server on loopback with the redis role's ACL users, for one test module; killed after it."""
    server = RedisServer(tmp_path_factory.mktemp("queue-redis"), free_loopback_port(), secrets.token_hex(16))
    server.start()
    try:
        yield server
    finally:
        server.kill()
