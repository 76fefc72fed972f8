"""Per-process state and the dependencies routes declare: `StateDep` and `PrincipalDep`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

import redis.asyncio as aioredis
from fastapi import Depends, Request
from fastapi.params import Depends as DependsParam
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmfleet.serve.gateway.auth import Principal, Verifier, bearer_token
from llmfleet.serve.gateway.config import GatewaySettings
from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.gateway.metrics import GatewayMetrics
from llmfleet.serve.gateway.validation import ModelInfo
from llmfleet.serve.queue.producer import Producer, ReplyListener
from llmfleet.serve.queue.registry import CachedRegistry


@dataclass
class AppState:
    """What one gateway process shares between requests; made by the app's lifespan, closed with it."""

    settings: GatewaySettings
    redis: aioredis.Redis
    blocking: aioredis.Redis
    producer: Producer
    replies: ReplyListener
    registry: CachedRegistry
    verifier: Verifier
    models: dict[str, ModelInfo]
    metrics: GatewayMetrics
    background: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run coroutine to completion even if the request that started it is cancelled."""
        task = asyncio.create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


async def get_state(request: Request) -> AppState:
    # async: FastAPI runs a plain `def` dependency in its thread pool, a thread
    # hand-off on every request (0.08 ms of CPU each, measured on a bare route).
    state: AppState = request.app.state.llmfleet
    return state


StateDep = Annotated[AppState, Depends(get_state)]

# auto_error=False: a missing or malformed header gets our 401 (OpenAI-shaped, with
# WWW-Authenticate), not FastAPI's 403. Declared so OpenAPI documents the scheme.
_bearer = HTTPBearer(auto_error=False, description="a JWT minted by `llmfleet token` (or your identity provider)")


async def _verify(state: AppState, authorization: str | None) -> Principal:
    try:
        # Async: keys from a JWKS URL may need a fetch, and with revocation on, Redis is asked (one EXISTS).
        return await state.verifier.authenticate(bearer_token(authorization), state.redis)
    except APIError:
        state.metrics.rejected.labels("auth").inc()
        raise


async def authenticate(
    request: Request,
    state: StateDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    return await _verify(state, request.headers.get("authorization"))


PrincipalDep = Annotated[Principal, Depends(authenticate)]

# Anthropic's SDK sends its key in this header; declared so OpenAPI documents it on the Messages routes.
_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="the JWT, as Anthropic's SDK sends its key")


async def authenticate_anthropic(
    request: Request,
    state: StateDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    _key: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    """As `authenticate`, for the Messages API: the token from `x-api-key`, else from `Authorization: Bearer`."""
    api_key = request.headers.get("x-api-key")
    authorization = request.headers.get("authorization")
    return await _verify(state, f"Bearer {api_key}" if api_key and not authorization else authorization)


AnthropicPrincipalDep = Annotated[Principal, Depends(authenticate_anthropic)]


def only_on_listener(ops_port: int, *, ops: bool) -> list[DependsParam]:
    """Route dependencies that keep a router to one listener: the ops port (ops=True) or the API port.

    The listener is the local port the connection came in on (the ASGI scope's
    `server`). On the other listener the route answers 404, as for any path
    that does not exist, before authentication: the API port does not reveal
    the ops routes, and the ops port does not ask for tokens.
    """

    async def check(request: Request) -> None:
        server = request.scope.get("server")
        if (server is not None and server[1] == ops_port) != ops:
            raise StarletteHTTPException(404)

    return [Depends(check)]
