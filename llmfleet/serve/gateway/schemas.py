"""Request bodies the gateway accepts: every OpenAI parameter the pinned vLLM (0.32) serves, with types checked.

Each field of the OpenAI chat and completions APIs is one of three kinds
(docs/gateway.md lists them):

- passed: checked here (type and bounds the engine accepts), then sent to
  the engine as given;
- ignored: accepted and type-checked, never sent (OpenAI-side features with
  nothing to do on a self-hosted engine: store, metadata, service_tier, ...);
- refused: a 400 naming the parameter, when it asks for something the
  engines cannot do (audio, web search, deprecated `functions`, ...). A null
  value is never refused: clients send null for "not set".

Null fields are dropped before the engine sees the request, and so are the
response-only fields clients echo back in an earlier assistant message
(refusal, annotations, audio: null, function_call: null). Unknown top-level
fields are refused, as OpenAI does, so nothing the gateway did not check
reaches an engine (a `max_completion_tokens` slipping past the cap, say).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# The most choices (n) one request may ask for: each is a sequence in the engine's batch.
MAX_CHOICES = 8
# vLLM's default --max-logprobs.
MAX_LOGPROBS = 20


def _utf8(value: str) -> str:
    """Refuse lone surrogates (valid JSON escapes, but not text any tokenizer can read)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


def _refuse(why: str) -> Any:
    def check(value: Any) -> Any:
        if value is not None:
            raise ValueError(why)
        return value

    return AfterValidator(check)


def require(model: BaseModel, what: str, names: tuple[str, ...]) -> None:
    """Refuse `model` (a `what`, say "a tool_use block") when any of the fields `names` is missing."""
    missing = [name for name in names if getattr(model, name) is None]
    if missing:
        raise ValueError(f"{what} needs {', '.join(missing)}")


Text = Annotated[str, AfterValidator(_utf8)]
ModelName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_utf8)]
StopText = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_utf8)]
Name = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_utf8)]
FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Refused = Annotated[Any, Field(default=None)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    # vLLM's own: usage on every chunk. The workers always ask for it; the client's choice is relayed as asked.
    continuous_usage_stats: bool | None = None


# -- messages ---------------------------------------------------------------


class ContentPart(_Strict):
    """A text part; an assistant's refusal part (echoed back) is dropped; images, audio and files are refused."""

    type: Literal["text", "refusal", "image_url", "input_audio", "file"]
    text: Text | None = None
    refusal: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None

    @model_validator(mode="after")
    def _check(self) -> ContentPart:
        if self.type in ("image_url", "input_audio", "file"):
            raise ValueError(f"content parts of type {self.type!r} are not supported: the served models read text")
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs `text`")
        return self


class FunctionCall(_Strict):
    name: FunctionName
    arguments: Annotated[str, Field(max_length=1_000_000), AfterValidator(_utf8)]


class ToolCall(_Strict):
    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Name | None = None
    # assistant
    tool_calls: list[ToolCall] | None = None
    reasoning: Text | None = Field(default=None, description="vLLM: an earlier turn's reasoning, for the template")
    # tool
    tool_call_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    # Response-only fields that clients echo back with an earlier assistant message: dropped.
    refusal: str | None = None
    annotations: list[Any] | None = None
    reasoning_content: str | None = None
    # Echoed as null: dropped; set: refused (the engines make no audio and know no `functions`).
    audio: Annotated[Refused, _refuse("audio is not supported: the served models make text")]
    function_call: Annotated[Refused, _refuse("function_call is deprecated and not supported; use tool_calls")]

    @model_validator(mode="after")
    def _check(self) -> ChatMessage:
        if self.role == "tool":
            if self.tool_call_id is None:
                raise ValueError("a tool message needs tool_call_id (the id of the call it answers)")
        elif self.tool_call_id is not None:
            raise ValueError("tool_call_id belongs to tool messages only")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages only")
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def engine_message(self) -> dict[str, Any]:
        """The message as the engine gets it: echoed response-only fields and nulls dropped."""
        message: dict[str, Any] = {"role": self.role}
        if isinstance(self.content, list):
            message["content"] = [{"type": "text", "text": part.text} for part in self.content if part.type == "text"]
        elif self.content is not None:
            message["content"] = self.content
        elif self.role == "assistant":
            message["content"] = None
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:  # an empty list is what some clients send for "no calls"
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.reasoning is not None and self.role == "assistant":
            message["reasoning"] = self.reasoning
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


# -- tools and formats ------------------------------------------------------


class FunctionDefinition(_Strict):
    name: FunctionName
    description: Annotated[str, AfterValidator(_utf8)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchema(_Strict):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs `json_schema`")
        return self


class StructuredOutputs(_Strict):
    """vLLM's own constraint (one of json, regex, choice, grammar, json_object)."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _check(self) -> StructuredOutputs:
        if sum(value is not None for value in (self.json_, self.regex, self.choice, self.grammar)) > 1:
            raise ValueError("structured_outputs takes one kind of constraint (json, regex, choice or grammar)")
        return self


# -- requests ---------------------------------------------------------------

Stop = StopText | Annotated[list[StopText], Field(max_length=4)]


def _logit_bias(value: dict[str, float]) -> dict[str, float]:
    for key, bias in value.items():
        if not key.isdigit():
            raise ValueError(f"logit_bias keys are token ids; {key[:20]!r} is not one")
        if not -100 <= bias <= 100:
            raise ValueError("logit_bias values are between -100 and 100")
    return value


LogitBias = Annotated[dict[str, float], Field(max_length=1024), AfterValidator(_logit_bias)]

# Fields the gateway acts on or accepts without passing on.
GATEWAY_ONLY = frozenset({"stream", "stream_options", "metadata", "store", "service_tier", "prompt_cache_retention",
                          "safety_identifier"})  # fmt: skip


class _Sampling(_Strict):
    model: ModelName
    # passed (OpenAI)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stop: Stop | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: LogitBias | None = None
    user: Annotated[str, Field(max_length=256), AfterValidator(_utf8)] | None = None
    # The worker's prefix_affinity key (llmfleet/serve/worker/affinity.py). Passed on: the pinned vLLM (0.32)
    # accepts it and ignores it on chat and completions (tests/integration/serve/gateway/test_engine_parameters.py).
    prompt_cache_key: Annotated[str, Field(max_length=1024), AfterValidator(_utf8)] | None = None
    # gateway
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # ignored: OpenAI-side features (stored completions, billing tiers, its prompt cache's retention)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    # passed (vLLM's own sampling parameters)
    ignore_eos: bool | None = Field(default=None, description="vLLM: keep generating past end-of-sequence")
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    min_tokens: int | None = Field(default=None, ge=0, le=1_000_000)
    stop_token_ids: Annotated[list[TokenId], Field(max_length=64)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    bad_words: Annotated[list[StopText], Field(max_length=64)] | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(max_length=100_000)] | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    return_tokens_as_token_ids: bool | None = None
    structured_outputs: StructuredOutputs | None = None
    # refused (the engines cannot do it, or the gateway owns it)
    use_beam_search: Annotated[Refused, _refuse("beam search is not offered by this gateway")]

    @model_validator(mode="after")
    def _check_sampling(self) -> _Sampling:
        if self.min_tokens is not None and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens is more than max_tokens")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options needs stream: true")
        if self.prompt_logprobs and self.stream:
            raise ValueError("prompt_logprobs cannot be streamed")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def choices(self) -> int:
        return self.n or 1

    def engine_payload(self) -> dict[str, Any]:
        """The body an engine gets: what the client sent, minus nulls and what only the gateway acts on."""
        payload = self.model_dump(exclude_none=True, by_alias=True, exclude=set(GATEWAY_ONLY))
        payload["stream"] = False
        return payload


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=2048)]
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000, description="same as max_tokens")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # vLLM's own template controls
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, str | int | float | bool | None] | None = None
    # refused
    modalities: list[Literal["text", "audio"]] | None = None
    audio: Annotated[Refused, _refuse("audio output is not supported: the served models make text")]
    prediction: Annotated[Refused, _refuse("predicted outputs are not supported by the engines")]
    web_search_options: Annotated[Refused, _refuse("web search is not available on this gateway")]
    functions: Annotated[Refused, _refuse("`functions` is deprecated and not supported; use `tools`")]
    function_call: Annotated[Refused, _refuse("`function_call` is deprecated and not supported; use `tool_choice`")]
    verbosity: Annotated[Refused, _refuse("verbosity is not supported by the engines")]

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.modalities is not None and "audio" in self.modalities:
            raise ValueError("modalities: only text is supported")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools:
            names = {tool.function.name for tool in self.tools}
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools")
        if self.response_format is not None and self.response_format.type != "text" and self.structured_outputs:
            raise ValueError("use response_format or structured_outputs, not both")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs an assistant message last")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def engine_payload(self) -> dict[str, Any]:
        payload = super().engine_payload()
        payload.pop("modalities", None)
        payload.pop("max_completion_tokens", None)
        payload["messages"] = [message.engine_message() for message in self.messages]
        if self.response_format is not None and self.response_format.type == "text":
            del payload["response_format"]  # the default: nothing to constrain
        return payload


class CompletionRequest(_Sampling):
    prompt: Text | Annotated[list[TokenId], Field(min_length=1, max_length=1_000_000)]
    echo: bool | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1, le=1)
    suffix: Annotated[Refused, _refuse("suffix (fill-in-the-middle) is not supported by the served models")]

    def engine_payload(self) -> dict[str, Any]:
        payload = super().engine_payload()
        payload.pop("best_of", None)  # 1, the only value accepted: the default
        return payload


class OwnShapeRequest(_Strict):
    """A request of an API the engines serve in its own shape (Responses, Messages): one answer, sent as checked.

    Each sets which field holds its max tokens, which field holds its input
    (for a length error), and what it accepts without passing on.
    """

    choices: ClassVar[int] = 1
    max_tokens_field: ClassVar[str]
    input_param: ClassVar[str]
    gateway_only: ClassVar[frozenset[str]]

    def requested_max_tokens(self) -> int | None:
        value = getattr(self, self.max_tokens_field)
        return value if isinstance(value, int) else None

    def engine_payload(self) -> dict[str, Any]:
        payload = self.model_dump(exclude_none=True, by_alias=True, exclude=set(self.gateway_only))
        payload["stream"] = False
        return payload


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
