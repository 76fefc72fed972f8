"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response

from llmfleet.serve.gateway import idempotency
from llmfleet.serve.gateway.deps import PrincipalDep, StateDep
from llmfleet.serve.gateway.routes import PREFER, completion_responses
from llmfleet.serve.gateway.schemas import ChatCompletionRequest
from llmfleet.serve.gateway.service import submit

router = APIRouter(tags=["chat"])

RESPONSES = completion_responses("chat.completion", "chat.completion.chunk")


@router.post("/v1/chat/completions", responses=RESPONSES, summary="Create a chat completion (OpenAI-compatible)")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    principal: PrincipalDep,
    state: StateDep,
    prefer: Annotated[str | None, Header(description=PREFER, max_length=256)] = None,
    idempotency_key: Annotated[
        str | None, Header(alias=idempotency.HEADER, description=idempotency.DESCRIPTION, pattern=idempotency.PATTERN)
    ] = None,
) -> Response:
    return await submit("chat", body, request, principal, state, prefer, idempotency_key)
