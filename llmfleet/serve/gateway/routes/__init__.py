"""One APIRouter per resource: chat, completions, responses, messages, models, tasks, and health (probes, metrics)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | int | None = None
    param: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer."""
    described = {
        400: "invalid request (bad field, prompt + max_tokens over the context, max_tokens over the cap)",
        401: "missing or invalid token",
        403: "the token may not use this model",
        404: "unknown model or task",
        413: "request body too large",
        429: "rate limit or concurrency cap reached (Retry-After, x-ratelimit-*)",
        502: "the engines failed the request",
        503: "queue full, queue unavailable, or no healthy engine (Retry-After)",
        504: "no answer before the deadline",
    }
    return {status: {"model": ErrorResponse, "description": described[status]} for status in statuses}


def completion_responses(answer: str, chunk: str) -> dict[int | str, dict[str, Any]]:
    """OpenAI-documented answers of a completion route: the object, its stream, a task, the errors."""
    return {
        200: {
            "description": f"a {answer} object, or with `stream: true` server-sent {chunk} events",
            "content": {"application/json": {}, "text/event-stream": {}},
        },
        202: {"description": "queued as a task (Prefer: respond-async)"},
        **errors(400, 401, 403, 404, 413, 429, 502, 503, 504),
    }
