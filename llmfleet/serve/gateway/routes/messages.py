"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API).

The token comes from `x-api-key` (Anthropic's SDK) or `Authorization:
Bearer`; errors on these routes are in Anthropic's shape
(errors.ANTHROPIC_PREFIX). count_tokens is answered by the gateway itself,
with the count its length check uses: no engine time.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from llmfleet.serve.gateway.deps import AnthropicPrincipalDep, StateDep
from llmfleet.serve.gateway.messages_schema import CountTokensRequest, MessagesRequest
from llmfleet.serve.gateway.routes import completion_responses
from llmfleet.serve.gateway.service import OptionsDep, served_model, submit
from llmfleet.serve.gateway.validation import count_chat_view

router = APIRouter(tags=["messages"])


class AnthropicError(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicError


def _anthropic_errors(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """The routes' OpenAPI answers, with errors in Anthropic's shape."""
    return {
        status: {**answer, "model": AnthropicErrorResponse} if "model" in answer else answer
        for status, answer in responses.items()
    }


RESPONSES = _anthropic_errors(completion_responses("message", "Messages API (message_start ... message_stop)"))


class TokenCount(BaseModel):
    input_tokens: int


@router.post("/v1/messages", responses=RESPONSES, summary="Create a message (Anthropic's Messages API)")
async def create_message(
    body: MessagesRequest,
    request: Request,
    principal: AnthropicPrincipalDep,
    state: StateDep,
    options: OptionsDep,
) -> Response:
    return await submit("messages", body, request, principal, state, options)


@router.post(
    "/v1/messages/count_tokens",
    response_model=TokenCount,
    responses=_anthropic_errors({status: RESPONSES[status] for status in (400, 401, 403, 404, 413)}),
    summary="Count a message request's input tokens (Anthropic's Messages API)",
)
async def count_tokens(body: CountTokensRequest, principal: AnthropicPrincipalDep, state: StateDep) -> TokenCount:
    model = served_model(state, principal, body.model)
    return TokenCount(input_tokens=await count_chat_view(model, body.chat_view()))
