"""POST /v1/responses (OpenAI's Responses API), and GET /v1/responses/{id}: always 404, no response is stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from llmfleet.serve.gateway.deps import PrincipalDep, StateDep
from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.gateway.responses_schema import NOT_STORED, ResponsesRequest
from llmfleet.serve.gateway.routes import completion_responses, errors
from llmfleet.serve.gateway.service import OptionsDep, submit

router = APIRouter(tags=["responses"])

RESPONSES = completion_responses("response", "Responses API (response.created ... response.completed)")


@router.post("/v1/responses", responses=RESPONSES, summary="Create a response (OpenAI's Responses API)")
async def create_response(
    body: ResponsesRequest,
    request: Request,
    principal: PrincipalDep,
    state: StateDep,
    options: OptionsDep,
) -> Response:
    return await submit("responses", body, request, principal, state, options)


@router.get(
    "/v1/responses/{response_id}",
    responses=errors(401, 404),
    summary="Not stored: always 404 (GET /v1/tasks/{id} reads a request's result by its x-request-id)",
)
async def get_response(response_id: Annotated[str, Path(max_length=256)], _principal: PrincipalDep) -> Response:
    raise APIError(
        404,
        f"response {response_id!r} was not stored: {NOT_STORED}. A request's result can be read for the"
        " retention period at GET /v1/tasks/{id}, with the id from its x-request-id header",
        "not_found_error",
        "response_not_stored",
        param="response_id",
    )
