"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmfleet.serve.gateway.deps import PrincipalDep, StateDep
from llmfleet.serve.gateway.routes import completion_responses
from llmfleet.serve.gateway.schemas import CompletionRequest
from llmfleet.serve.gateway.service import OptionsDep, submit

router = APIRouter(tags=["completions"])

RESPONSES = completion_responses("text_completion", "text_completion")


@router.post("/v1/completions", responses=RESPONSES, summary="Create a completion (OpenAI-compatible)")
async def completions(
    body: CompletionRequest,
    request: Request,
    principal: PrincipalDep,
    state: StateDep,
    options: OptionsDep,
) -> Response:
    return await submit("completion", body, request, principal, state, options)
