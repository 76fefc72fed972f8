"""Errors the gateway answers with, in OpenAI's shape: {"error": {"message", "type", "code", "param"}}."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmfleet.serve.queue.jobs import error_body


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param
        self.headers = dict(headers or {})
        self.extra = extra

    def response(self) -> JSONResponse:
        body = error_body(self.message, self.kind, self.code, param=self.param, **self.extra)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# Anthropic's error types by HTTP status (its SDK picks an exception class by status, and shows the type).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
# The routes that answer errors in Anthropic's shape.
ANTHROPIC_PREFIX = "/v1/messages"


def anthropic_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error body in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    message = str(message or f"request failed ({status})")
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def shaped(path: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An error body in the shape of the route it answers (Anthropic's on /v1/messages*); other bodies as they are."""
    if status != 200 and path.startswith(ANTHROPIC_PREFIX) and "error" in body and body.get("type") != "error":
        return anthropic_error(status, body)
    return body


def unauthorized(message: str) -> APIError:
    # RFC 6750: say why, without echoing the token.
    description = "".join(c if " " <= c <= "~" and c not in '"\\' else "?" for c in message)
    return APIError(
        401,
        message,
        "authentication_error",
        "invalid_token",
        headers={
            "WWW-Authenticate": f'Bearer realm="llmfleet", error="invalid_token", error_description="{description}"'
        },
    )


def queue_unavailable() -> APIError:
    return APIError(
        503,
        "the queue is unavailable; retry shortly",
        "server_error",
        "queue_unavailable",
        headers={"Retry-After": "1"},
    )


def gateway_busy() -> APIError:
    return APIError(
        503,
        "the gateway has no free connection to the queue right now; retry shortly",
        "server_error",
        "gateway_busy",
        headers={"Retry-After": "1"},
    )


def pool_exhausted(error: RedisError) -> bool:
    """Whether the error is this process's Redis pool, all of whose connections stayed busy, not Redis itself.

    redis-py's BlockingConnectionPool (RedisSettings.client) raises ConnectionError("No connection available.")
    from the asyncio timeout of its wait for a free connection; Redis may be perfectly healthy.
    """
    return isinstance(error, RedisConnectionError) and isinstance(error.__cause__, TimeoutError)


def queue_error(error: RedisError) -> APIError:
    """The client's 503 for a Redis error: gateway_busy when the pool ran out, queue_unavailable otherwise."""
    return gateway_busy() if pool_exhausted(error) else queue_unavailable()


@contextlib.contextmanager
def queue_errors_as_503() -> Iterator[None]:
    """A Redis error inside becomes the client's 503 (queue_error), with Retry-After."""
    try:
        yield
    except RedisError as error:
        raise queue_error(error) from None


async def api_error_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, APIError)
    if request.url.path.startswith(ANTHROPIC_PREFIX):
        body = anthropic_error(error.status, error_body(error.message, error.kind))
        return JSONResponse(body, status_code=error.status, headers=error.headers)
    return error.response()


async def validation_error_handler(request: Request, error: Exception) -> JSONResponse:
    """400 (OpenAI's status for a bad request) naming the first bad field; never echoing values."""
    assert isinstance(error, RequestValidationError)
    problems = []
    param = None
    for item in error.errors()[:5]:
        location = [str(part) for part in item.get("loc", ()) if part != "body"]
        where = ".".join(location) or "body"
        param = param or where
        text = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        if item.get("type") == "extra_forbidden":
            text = "not a parameter this gateway accepts (docs/gateway.md lists them)"
        problems.append(f"{where}: {text}")
    message = "invalid request: " + "; ".join(problems) if problems else "invalid request"
    body = error_body(message, "invalid_request_error", "invalid_request", param=param)
    return JSONResponse(shaped(request.url.path, 400, body), status_code=400)


async def http_error_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        shaped(request.url.path, error.status_code, error_body(str(error.detail), kind, None)),
        status_code=error.status_code,
        headers=getattr(error, "headers", None),
    )
