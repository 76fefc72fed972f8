"""/healthz (liveness), and the ops routes /readyz (Redis reachable and a healthy engine) and /metrics.

No auth and no per-user data. `router` (liveness) is on every listener, so a
load balancer can probe the API port; `ops_router` is on the ops port when
LLMFLEET_GATEWAY_OPS_PORT is set (app.create_app).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from llmfleet.serve.gateway.deps import StateDep

router = APIRouter(tags=["operations"])
ops_router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@ops_router.get(
    "/readyz",
    summary="Readiness: Redis answers and a live worker sees a healthy engine",
    responses={503: {"description": "not ready; the body says why"}},
)
async def readyz(state: StateDep) -> JSONResponse:
    try:
        await state.redis.ping()
        snapshot = await state.registry.snapshot()
    except RedisError as error:
        return JSONResponse({"ready": False, "redis": False, "reason": f"redis: {type(error).__name__}"}, 503)
    ready = snapshot.healthy_engines > 0
    body = {
        "ready": ready,
        "redis": True,
        "workers": snapshot.workers,
        "healthy_engines": snapshot.healthy_engines,
        "models": sorted(snapshot.models),
    }
    if not ready:
        body["reason"] = "no live worker reports a healthy engine"
    return JSONResponse(body, 200 if ready else 503)


@ops_router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: StateDep) -> Response:
    state.metrics.waiting.set(len(state.replies.waiters))
    state.metrics.redis_up.set(1 if state.replies.connected.is_set() else 0)
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
