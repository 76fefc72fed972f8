"""What travels through the queue: a job, its result, and the events on a reply stream."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["chat", "completion", "responses", "messages"]
ENDPOINTS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "responses": "/v1/responses",  # OpenAI's Responses API
    "messages": "/v1/messages",  # Anthropic's Messages API
}
# The APIs whose streams are named events (`event: <type>` + `data: {"type": <type>, ...}`), passed through as
# the engine wrote them; their answers carry no `choices`.
EVENT_KINDS = frozenset({"responses", "messages"})


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Job:
    """One request, as the gateway admitted it.

    payload is the body sent to the engine (the OpenAI request, validated, with
    max_tokens resolved); reply is the gateway process's reply stream, empty in
    task mode (nobody waits: the result is only stored).
    """

    id: str
    kind: Kind
    model: str
    payload: dict[str, Any]
    stream: bool
    reply: str
    subject: str
    tenant: str
    lane: str
    prompt_tokens: int
    max_tokens: int
    enqueued_ms: int
    deadline_ms: int
    queue_deadline_ms: int

    def to_json(self) -> str:
        # vars(), not dataclasses.asdict(): asdict deep-copies the payload first.
        return json.dumps(vars(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Job:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a job is a JSON object")
        kind = data.get("kind")
        if kind not in ENDPOINTS:
            raise ValueError(f"unknown job kind {kind!r}")
        return cls(**data)

    @property
    def endpoint(self) -> str:
        return ENDPOINTS[self.kind]


@dataclass(frozen=True)
class Result:
    """The one answer a request gets: an HTTP status and an OpenAI-shaped body."""

    status: int
    body: dict[str, Any]
    attempt: int = 0
    worker: str = ""
    finished_ms: int = field(default_factory=now_ms)

    def to_json(self) -> str:
        return json.dumps(vars(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Result:
        data = json.loads(text)
        return cls(
            status=int(data["status"]),
            body=dict(data["body"]),
            attempt=int(data.get("attempt", 0)),
            worker=str(data.get("worker", "")),
            finished_ms=int(data.get("finished_ms", 0)),
        )

    @property
    def ok(self) -> bool:
        return self.status == 200


def error_body(message: str, kind: str, code: str | int | None = None, **extra: Any) -> dict[str, Any]:
    """An OpenAI-style error object: {"error": {"message", "type", "code", ...}}."""
    return {"error": {"message": message, "type": kind, "code": code, **extra}}


def result_text(kind: str, body: dict[str, Any]) -> str:
    """The generated text of a complete (non-streamed) response."""
    choices = body.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    if kind == "chat":
        message = choice.get("message") or {}
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def usage_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens of an answer's usage, in OpenAI's names or the Responses and Messages APIs'."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return int(prompt or 0), int(completion or 0)


@dataclass(frozen=True)
class ReplyEvent:
    """One entry of a reply stream.

    kind "chunk": data is a JSON list of OpenAI chunk objects and text their
    concatenated delta; seq numbers chunk entries 1, 2, ... per request across
    attempts (only the owning attempt may add one). kind "final": data is the
    Result JSON.
    """

    request_id: str
    kind: Literal["chunk", "final"]
    seq: int
    data: str
    text: str = ""

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> ReplyEvent:
        kind = fields.get("kind", "")
        if kind not in ("chunk", "final"):
            raise ValueError(f"unknown reply event kind {kind!r}")
        return cls(
            request_id=fields["id"],
            kind="chunk" if kind == "chunk" else "final",
            seq=int(fields.get("seq", "0")),
            data=fields.get("data", ""),
            text=fields.get("text", ""),
        )
