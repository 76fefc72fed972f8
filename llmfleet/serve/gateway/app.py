"""The gateway's app factory: create_app(settings) -> FastAPI.

Everything that can be wrong with the settings (secret files, tokenizers)
fails here, before a port is bound. Redis clients are made per process in the
lifespan and closed with it. The gateway never calls an engine itself: the
workers do, so it holds no HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmfleet import __version__
from llmfleet.serve.gateway.auth import Verifier
from llmfleet.serve.gateway.config import GatewaySettings
from llmfleet.serve.gateway.deps import AppState, only_on_listener
from llmfleet.serve.gateway.errors import APIError, api_error_handler, http_error_handler, validation_error_handler
from llmfleet.serve.gateway.metrics import GatewayMetrics
from llmfleet.serve.gateway.middleware import BodyLimit, Metrics, RequestId
from llmfleet.serve.gateway.routes import chat, completions, health, messages, models, responses, tasks
from llmfleet.serve.gateway.validation import load_model
from llmfleet.serve.queue.producer import Producer, ReplyListener
from llmfleet.serve.queue.registry import CachedRegistry

log = logging.getLogger(__name__)

DESCRIPTION = """OpenAI-compatible API (chat, completions, Responses) and Anthropic's Messages API in
front of vLLM engines, with JWT auth, rate limits and a Redis queue drained by workers. Send
`Authorization: Bearer <JWT>` (or, on /v1/messages, `x-api-key: <JWT>`). Add `Prefer: respond-async`
to queue a request as a task and read it from `/v1/tasks/{id}`."""


API_ROUTERS = (chat.router, completions.router, responses.router, messages.router, models.router, tasks.router)


def create_app(settings: GatewaySettings) -> FastAPI:
    verifier = Verifier(settings)
    loaded = {name: load_model(name, path, settings.max_model_len.get(name)) for name, path in settings.models.items()}
    metrics = GatewayMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = settings.redis.client(name=settings.id)
        # The reply reader blocks up to 2 s per read: a client (and pool) of its own.
        blocking = settings.redis.client(blocking_s=2.0, name=f"{settings.id}-replies")
        producer = Producer(client, settings.queue, settings.id)
        try:
            await producer.ensure_groups(loaded)
        except RedisError as error:  # not fatal: /readyz says so until Redis answers
            log.warning("redis not reachable at start-up: %s", error)
        replies = ReplyListener(blocking, producer.reply_key)
        replies.start()
        state = AppState(
            settings=settings,
            redis=client,
            blocking=blocking,
            producer=producer,
            replies=replies,
            registry=CachedRegistry(client, producer.keys, max_age_s=settings.registry_max_age_s),
            verifier=verifier,
            models=loaded,
            metrics=metrics,
        )
        app.state.llmfleet = state
        log.info("gateway %s serving %s", settings.id, ", ".join(sorted(loaded)))
        try:
            yield
        finally:
            await replies.stop()
            if state.background:
                await asyncio.wait(state.background, timeout=5)
            await client.aclose()
            await blocking.aclose()

    docs = settings.docs
    app = FastAPI(
        title="llmfleet gateway",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.include_router(health.router)
    if settings.ops_port is None:
        for router in (*API_ROUTERS, health.ops_router):
            app.include_router(router)
    else:
        for router in API_ROUTERS:
            app.include_router(router, dependencies=only_on_listener(settings.ops_port, ops=False))
        # Not in the public schema: the API port does not serve them.
        app.include_router(
            health.ops_router, dependencies=only_on_listener(settings.ops_port, ops=True), include_in_schema=False
        )
    # Added last = outermost: Metrics sees the 413s BodyLimit answers; RequestId tags every answer
    # and turns any exception that got this far into an OpenAI-shaped 500.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(Metrics, metrics=metrics)
    app.add_middleware(RequestId)
    return app
