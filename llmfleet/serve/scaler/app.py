"""The scaler's HTTP app: POST /alerts (Alertmanager's webhook), POST /failures/reset, GET /status, /healthz, /metrics.

Bad input never reaches the policy: a call without the right bearer token is
401, a body over max_body_bytes 413, a body that is not Alertmanager's payload
version 4 is 400 with the reason. Each is counted and audited (never with the
token or the body). A well-formed notification is 200 whatever is decided: the
decisions are in the answer and the audit log, and Alertmanager must not retry
a notification that was judged.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from llmfleet.serve.scaler.config import ScalerSettings
from llmfleet.serve.scaler.fleet import AnsibleInventory, FleetSource
from llmfleet.serve.scaler.metrics import ScalerMetrics
from llmfleet.serve.scaler.payload import Notification
from llmfleet.serve.scaler.runner import AnsibleRunner, PlaybookRunner
from llmfleet.serve.scaler.service import Scaler
from llmfleet.serve.scaler.state import Direction, Kind

router = APIRouter()


def scaler_of(request: Request) -> Scaler:
    scaler: Scaler = request.app.state.scaler
    return scaler


def authenticate(request: Request) -> None:
    """A dependency: the bearer token must match the token file's (compared in constant time)."""
    scaler = scaler_of(request)
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    expected: str = request.app.state.token
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected.encode()):
        scaler.metrics.notifications.labels(result="unauthorized").inc()
        scaler.audit.write("rejected", status=401, path=request.url.path, reason="missing or wrong bearer token")
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


Authenticated = Annotated[None, Depends(authenticate)]


def describe(error: ValidationError) -> list[str]:
    return [f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}" for item in error.errors()][:20]


@router.post("/alerts")
async def alerts(request: Request, _auth: Authenticated) -> JSONResponse:
    scaler = scaler_of(request)
    body = await request.body()
    if len(body) > scaler.settings.max_body_bytes:
        scaler.metrics.notifications.labels(result="too_large").inc()
        scaler.audit.write("rejected", status=413, reason=f"body of {len(body)} bytes")
        return JSONResponse({"detail": f"body over {scaler.settings.max_body_bytes} bytes"}, status_code=413)
    try:
        notification = Notification.model_validate_json(body)
    except ValidationError as error:
        reasons = describe(error)
        scaler.metrics.notifications.labels(result="malformed").inc()
        scaler.audit.write("rejected", status=400, reason="; ".join(reasons))
        return JSONResponse(
            {"detail": "not an Alertmanager webhook payload (version 4)", "errors": reasons}, status_code=400
        )
    scaler.metrics.notifications.labels(result="accepted").inc()
    decisions = await scaler.handle(notification)
    return JSONResponse({"decisions": decisions})


@router.get("/status")
async def status(request: Request, _auth: Authenticated) -> dict[str, Any]:
    scaler = scaler_of(request)
    return {"dry_run": scaler.settings.dry_run, "state": scaler.state.model_dump(mode="json")}


@router.post("/failures/reset")
async def reset_failures(
    request: Request, _auth: Authenticated, kind: Kind | None = None, direction: Direction | None = None
) -> dict[str, list[str]]:
    """The operator's reset of a give-up: forget the failures in a row (of one kind and/or direction, or all)."""
    return {"reset": await scaler_of(request).reset_failures(kind, direction)}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(scaler_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(
    settings: ScalerSettings,
    *,
    runner: PlaybookRunner | None = None,
    fleet: FleetSource | None = None,
    metrics: ScalerMetrics | None = None,
) -> FastAPI:
    """The app; the token file is read now, so a bad one fails before a port is bound."""
    token = settings.token()
    scaler = Scaler(
        settings,
        runner or AnsibleRunner(settings),
        fleet or AnsibleInventory(settings),
        metrics or ScalerMetrics(),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await scaler.start()
        try:
            yield
        finally:
            await scaler.stop()

    app = FastAPI(title="llmfleet scaler", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scaler = scaler
    app.state.token = token
    app.include_router(router)
    return app
