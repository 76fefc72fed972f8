"""Request bodies the gateway accepts: the OpenAI fields it passes on, with bounds the engine accepts.

Unknown fields are refused (400) rather than passed through, so nothing
reaches an engine that the gateway did not check (a `max_completion_tokens`
slipping past the max_tokens cap, say). One choice per request (n = 1).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _utf8(value: str) -> str:
    """Refuse lone surrogates (valid JSON escapes, but not text any tokenizer can read)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


Text = Annotated[str, AfterValidator(_utf8)]
ModelName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_utf8)]
StopText = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_utf8)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None = None


class _Sampling(_Strict):
    model: ModelName
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=1, description="one choice per request")
    stop: StopText | Annotated[list[StopText], Field(max_length=4)] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    ignore_eos: bool | None = Field(default=None, description="vLLM: keep generating past end-of-sequence")
    user: Annotated[str, Field(max_length=256), AfterValidator(_utf8)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def engine_payload(self) -> dict[str, Any]:
        """The body an engine gets: what the client sent, minus what only the gateway acts on."""
        payload = self.model_dump(exclude_none=True, exclude={"stream_options", "max_completion_tokens"})
        payload["stream"] = False
        return payload


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=2048)]
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000, description="same as max_tokens")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: Text | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=1_000_000)]


class TaskAccepted(BaseModel):
    id: str
    object: Literal["task"] = "task"
    status: Literal["queued"] = "queued"
    url: str


TaskState = Literal["queued", "running", "completed", "failed", "cancelled"]


class TaskStatus(BaseModel):
    id: str
    object: Literal["task"] = "task"
    status: TaskState
    attempts: int = 0
    http_status: int | None = Field(default=None, description="the status the synchronous call would have had")
    result: dict[str, Any] | None = Field(default=None, description="the response body (or error) once finished")
