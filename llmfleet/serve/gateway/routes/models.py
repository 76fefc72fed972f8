"""GET /v1/models: the models this gateway serves that a live engine serves now, and the token may use."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel
from redis.exceptions import RedisError

from llmfleet.serve.gateway.deps import PrincipalDep, StateDep
from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.gateway.routes import errors

router = APIRouter(tags=["models"])


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "llmfleet"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


@router.get("/v1/models", response_model=ModelList, responses=errors(401, 503), summary="List the served models")
async def list_models(principal: PrincipalDep, state: StateDep) -> ModelList:
    try:
        snapshot = await state.registry.snapshot()
    except RedisError:
        raise APIError(
            503,
            "the engine registry is unavailable; retry shortly",
            "server_error",
            "queue_unavailable",
            headers={"Retry-After": "1"},
        ) from None
    data = [
        Model(id=name, max_model_len=info.max_model_len(snapshot.models[name].max_model_len))
        for name, info in sorted(state.models.items())
        if name in snapshot.models and principal.may_use(name)
    ]
    return ModelList(data=data)
