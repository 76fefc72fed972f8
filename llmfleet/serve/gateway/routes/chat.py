"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmfleet.serve.gateway.deps import PrincipalDep, StateDep
from llmfleet.serve.gateway.routes import completion_responses
from llmfleet.serve.gateway.schemas import ChatCompletionRequest
from llmfleet.serve.gateway.service import OptionsDep, submit

router = APIRouter(tags=["chat"])

RESPONSES = completion_responses("chat.completion", "chat.completion.chunk")


@router.post("/v1/chat/completions", responses=RESPONSES, summary="Create a chat completion (OpenAI-compatible)")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    principal: PrincipalDep,
    state: StateDep,
    options: OptionsDep,
) -> Response:
    return await submit("chat", body, request, principal, state, options)
