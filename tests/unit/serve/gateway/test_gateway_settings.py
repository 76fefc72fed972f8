"""Gateway and worker settings: required values, secrets only from files, placeholders refused at start-up."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import ValidationError

from llmfleet.serve.gateway.app import API_ROUTERS, create_app
from llmfleet.serve.gateway.config import GatewaySettings
from llmfleet.serve.gateway.deps import only_on_listener
from llmfleet.serve.gateway.routes import health
from llmfleet.serve.queue.config import QueueSettings, RedisSettings, SettingsError, describe_validation_error
from llmfleet.serve.worker.config import WorkerSettings

Make = Callable[..., GatewaySettings]


def test_defaults_are_usable(make_settings: Make) -> None:
    settings = make_settings()
    assert settings.jwt_algorithms == ("HS256",)
    assert settings.queue.lanes == ("high", "normal", "low")
    assert settings.tiers["default"].requests_per_minute == 600
    create_app(settings)  # reads the secret and the tokenizer: nothing missing


def test_the_schema_and_docs_are_served_only_when_asked_for(make_settings: Make) -> None:
    hidden = create_app(make_settings())
    assert (hidden.openapi_url, hidden.docs_url) == (None, None)
    assert not {"/openapi.json", "/docs"} & {getattr(route, "path", "") for route in hidden.routes}
    shown = create_app(make_settings(LLMFLEET_GATEWAY_DOCS="true"))
    assert {"/openapi.json", "/docs"} <= {getattr(route, "path", "") for route in shown.routes}


def test_models_are_required(make_settings: Make) -> None:
    with pytest.raises(ValidationError, match="models"):
        make_settings(LLMFLEET_GATEWAY_MODELS=None)


def test_a_longest_poll_below_the_first_is_refused(make_settings: Make) -> None:
    refused = r"RESULT_POLL_MAX_S \(1\) is below LLMFLEET_GATEWAY_RESULT_POLL_S \(5\)"
    with pytest.raises(ValidationError, match=refused):
        make_settings(LLMFLEET_GATEWAY_RESULT_POLL_S="5", LLMFLEET_GATEWAY_RESULT_POLL_MAX_S="1")
    equal = make_settings(LLMFLEET_GATEWAY_RESULT_POLL_S="5", LLMFLEET_GATEWAY_RESULT_POLL_MAX_S="5")
    assert equal.result_poll_max_s == 5


@pytest.mark.parametrize("placeholder", ["CHANGE-ME", "change-me\n", "changeme", "TODO"])
def test_a_placeholder_secret_is_refused_at_start_up(make_settings: Make, secret_file: Path, placeholder: str) -> None:
    secret_file.write_text(placeholder)
    with pytest.raises(SettingsError, match="placeholder") as error:
        create_app(make_settings())
    assert placeholder.strip() not in str(error.value)  # names the file, never the content


def test_a_short_or_world_readable_secret_is_refused(make_settings: Make, secret_file: Path) -> None:
    secret_file.write_text("too-short-but-not-a-placeholder")
    with pytest.raises(SettingsError, match="shorter than 32"):
        create_app(make_settings())
    secret_file.write_text("x" * 64)
    secret_file.chmod(0o644)
    with pytest.raises(SettingsError, match="readable by everyone"):
        create_app(make_settings())


def test_secrets_in_environment_values_are_refused(make_settings: Make) -> None:
    with pytest.raises(SettingsError, match="only from files"):
        make_settings(LLMFLEET_GATEWAY_JWT_SECRET="s3cr3t" * 8)
    with pytest.raises(SettingsError, match="LLMFLEET_REDIS_PASSWORD_FILE"):
        make_settings(LLMFLEET_GATEWAY_JWT_SECRET=None, LLMFLEET_REDIS_PASSWORD="hunter2")
    with pytest.raises(ValidationError, match="must not carry a password"):
        make_settings(LLMFLEET_REDIS_PASSWORD=None, LLMFLEET_REDIS_URL="redis://user:hunter2@127.0.0.1:6379/0")


def test_a_redis_password_file_is_checked_at_start_up(make_settings: Make, tmp_path: Path) -> None:
    password = tmp_path / "redis.password"
    password.write_text("CHANGE-ME")
    password.chmod(0o600)
    with pytest.raises(SettingsError, match="LLMFLEET_REDIS_PASSWORD_FILE"):
        make_settings(LLMFLEET_REDIS_PASSWORD_FILE=str(password))
    missing = tmp_path / "nowhere"
    with pytest.raises(SettingsError, match="does not exist"):
        make_settings(LLMFLEET_REDIS_PASSWORD_FILE=str(missing))


@pytest.mark.parametrize(
    ("algorithms", "message"),
    [
        (["none"], "never 'none'"),
        (["HS256", "RS256"], "HS256/HS384/HS512 only"),
    ],
)
def test_the_algorithm_allow_list_is_checked(make_settings: Make, algorithms: list[str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        make_settings(LLMFLEET_GATEWAY_JWT_ALGORITHMS=json.dumps(algorithms))


def test_exactly_one_key_source(make_settings: Make, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        make_settings(LLMFLEET_GATEWAY_JWT_SECRET_FILE=None)
    jwks = tmp_path / "jwks.json"
    jwks.write_text("{}")
    with pytest.raises(ValidationError, match="exactly one"):
        make_settings(LLMFLEET_GATEWAY_JWT_JWKS_FILE=str(jwks))
    # A public key never verifies HMAC tokens (algorithm confusion).
    with pytest.raises(ValidationError, match="drop the HS algorithms"):
        make_settings(LLMFLEET_GATEWAY_JWT_SECRET_FILE=None, LLMFLEET_GATEWAY_JWT_JWKS_FILE=str(jwks))


def test_a_model_without_a_tokenizer_is_refused(make_settings: Make, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"tokenizer\.json does not exist"):
        create_app(make_settings(LLMFLEET_GATEWAY_MODELS=json.dumps({"tiny": str(tmp_path)})))


def test_queue_lanes_and_priorities() -> None:
    queue = QueueSettings()
    assert queue.lane_for(None) == "normal"
    assert queue.lane_for("high") == "high"
    assert queue.lane_for(0) == "high"
    assert queue.lane_for(99) == "low"
    with pytest.raises(ValueError, match="not a lane"):
        queue.lane_for("urgent")
    with pytest.raises(ValidationError, match="DEFAULT_LANE"):
        QueueSettings(lanes=("a", "b"))


def test_worker_settings_need_engines_and_check_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_WORKER_ENGINES", raising=False)
    with pytest.raises(ValidationError) as error:
        WorkerSettings.from_env()
    assert describe_validation_error(error.value) == "  LLMFLEET_WORKER_ENGINES: Field required"
    monkeypatch.setenv("LLMFLEET_WORKER_ENGINES", '["http://10.0.0.5:8000/v1"]')
    with pytest.raises(ValidationError, match="give the server root"):
        WorkerSettings.from_env()
    monkeypatch.setenv("LLMFLEET_WORKER_ENGINES", '["http://10.0.0.5:8000", "http://10.0.0.6:8000/"]')
    settings = WorkerSettings.from_env()
    assert settings.engines == ("http://10.0.0.5:8000", "http://10.0.0.6:8000")
    assert settings.heartbeat_s == settings.queue.claim_idle_ms / 3000


def test_validation_errors_never_echo_values() -> None:
    with pytest.raises(ValidationError) as error:
        RedisSettings(url="redis://user:hunter2@host:6379/0")
    assert "hunter2" not in describe_validation_error(error.value)


def _blocking_calls(dependant: Dependant) -> list[str]:
    """The dependencies under dependant that FastAPI would run in its thread pool (plain functions)."""
    found = []
    for dependency in dependant.dependencies:
        call = dependency.call
        handler = call if inspect.isfunction(call) else type(call).__call__  # a callable object, such as HTTPBearer
        if not inspect.iscoroutinefunction(handler):
            found.append(getattr(call, "__qualname__", repr(call)))
        found += _blocking_calls(dependency)
    return found


def test_no_route_hands_off_to_the_thread_pool() -> None:
    # A plain `def` endpoint or dependency costs a thread hand-off on every request
    # (0.08 ms of CPU each on a bare route; a bare route answers 0.09 ms without it).
    listener_checks = [*only_on_listener(9300, ops=True), *only_on_listener(9300, ops=False)]
    assert [check.dependency for check in listener_checks if not inspect.iscoroutinefunction(check.dependency)] == []
    routers = (*API_ROUTERS, health.router, health.ops_router)
    routes = [route for router in routers for route in router.routes if isinstance(route, APIRoute)]
    assert len(routes) >= 7
    blocking = {
        route.path: [
            *([] if inspect.iscoroutinefunction(route.endpoint) else ["the endpoint"]),
            *_blocking_calls(route.dependant),
        ]
        for route in routes
    }
    assert {path: calls for path, calls in blocking.items() if calls} == {}
