"""The ops listener: with LLMFLEET_GATEWAY_OPS_PORT set, /metrics and /readyz answer only on that port.

The requests here stop at the listener check, before any route needs Redis,
so no lifespan runs (the clients are not entered); the integration stack serves both ports for real
(tests/integration/serve/gateway/test_gateway.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from llmfleet.serve.gateway.app import create_app
from llmfleet.serve.gateway.config import GatewaySettings

Make = Callable[..., GatewaySettings]
API_PORT = 8080
OPS_PORT = 9300


@pytest.fixture
def clients(make_settings: Make) -> tuple[TestClient, TestClient]:
    """Clients of one app on its API port and on its ops port (the ASGI scope's server port)."""
    app = create_app(
        make_settings(
            LLMFLEET_GATEWAY_PORT=str(API_PORT), LLMFLEET_GATEWAY_OPS_PORT=str(OPS_PORT), LLMFLEET_GATEWAY_DOCS="true"
        )
    )
    return TestClient(app, base_url=f"http://testserver:{API_PORT}"), TestClient(
        app, base_url=f"http://testserver:{OPS_PORT}"
    )


def test_the_api_port_hides_the_ops_routes(clients: tuple[TestClient, TestClient]) -> None:
    api, _ops = clients
    unknown = api.get("/no-such-path")
    assert unknown.status_code == 404
    for path in ("/metrics", "/readyz"):
        answer = api.get(path)
        # The same answer as a path that does not exist: nothing tells a client the route is there.
        assert (answer.status_code, answer.json()) == (404, unknown.json()), path


def test_the_ops_port_serves_no_api_and_asks_for_no_token(clients: tuple[TestClient, TestClient]) -> None:
    _api, ops = clients
    assert ops.get("/v1/models").status_code == 404
    assert ops.post("/v1/chat/completions", json={"model": "tiny", "messages": []}).status_code == 404
    assert ops.get("/v1/tasks/abc").status_code == 404
    # On the API port the same request needs a token first.
    assert "WWW-Authenticate" not in ops.get("/v1/models").headers


def test_liveness_answers_on_both_ports(clients: tuple[TestClient, TestClient]) -> None:
    for client in clients:
        assert client.get("/healthz").json() == {"status": "ok"}


def test_the_public_schema_leaves_the_ops_routes_out(
    clients: tuple[TestClient, TestClient], make_settings: Make
) -> None:
    api, _ops = clients
    paths = set(api.get("/openapi.json").json()["paths"])
    assert "/healthz" in paths
    assert not {"/metrics", "/readyz"} & paths
    # Without an ops port the one listener serves them, and the schema lists them.
    single = TestClient(create_app(make_settings(LLMFLEET_GATEWAY_OPS_PORT=None, LLMFLEET_GATEWAY_DOCS="true")))
    assert {"/metrics", "/readyz"} <= set(single.get("/openapi.json").json()["paths"])


def test_the_ops_port_must_differ_from_the_api_port(make_settings: Make) -> None:
    with pytest.raises(ValueError, match="LLMFLEET_GATEWAY_OPS_PORT 8080 is the API port"):
        make_settings(LLMFLEET_GATEWAY_PORT="8080", LLMFLEET_GATEWAY_OPS_PORT="8080")
