"""POST /v1/responses (OpenAI's Responses API): the fields the pinned vLLM (0.32) serves, checked before queueing.

As for chat (schemas.py), each field is passed (checked, then sent as given),
ignored (accepted, never sent) or refused with a 400 naming it; unknown fields
are refused. What is refused and why:

- `previous_response_id`, `store: true`, `background: true`, `conversation`,
  `prompt`: they need responses kept on the server. This gateway keeps none
  (an engine's own store is per process, so another engine could not
  continue the conversation): send the whole conversation in `input` (the
  SDK's `response.output` items can be appended as they are), and use
  `Prefer: respond-async` for a background request.
- tools other than `function` (web search, file search, code interpreter,
  MCP, ...) and input images, files and audio: the engines have none of them.
- `truncation: "auto"`: the prompt is checked against the context before
  queueing, as for chat; a prompt with no room left is a 400.

The length check counts the chat that vLLM makes of the request
(`instructions` as a system message, then the input items in order), with
the model's chat template, exactly as chat completions are counted.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from llmfleet.serve.gateway.schemas import (
    MAX_LOGPROBS,
    FunctionName,
    ModelName,
    OwnShapeRequest,
    Refused,
    StopText,
    StructuredOutputs,
    Text,
    TokenId,
    _refuse,
    _Strict,
    require,
)

NOT_STORED = (
    "this gateway does not store responses; send the whole conversation in `input` (earlier `output` items "
    "can be sent back as they are)"
)


def _refuse_true(why: str) -> Any:
    def check(value: bool | None) -> bool | None:
        if value:
            raise ValueError(why)
        return value

    return AfterValidator(check)


class TextPart(_Strict):
    """A text part of a message: the client's input_text, or an earlier answer's output_text sent back."""

    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file", "input_audio"]
    text: Text | None = None
    refusal: str | None = None
    # output_text, echoed back: dropped
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None
    # refused
    image_url: Any = None
    file_id: Any = None
    file_data: Any = None
    file_url: Any = None
    filename: Any = None
    detail: Any = None
    input_audio: Any = None

    @model_validator(mode="after")
    def _check(self) -> TextPart:
        if self.type in ("input_image", "input_file", "input_audio"):
            raise ValueError(f"content parts of type {self.type!r} are not supported: the served models read text")
        if self.type in ("input_text", "output_text") and self.text is None:
            raise ValueError(f"a {self.type} part needs `text`")
        return self


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: Text


class InputItem(_Strict):
    """One item of `input`: a message, a function call and its output, or an earlier answer's reasoning."""

    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    id: Annotated[str, Field(max_length=256)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    # message
    role: Literal["user", "system", "developer", "assistant"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None  # an earlier answer's, sent back
    content: Text | list[TextPart] | list[ReasoningText] | None = None
    # function_call
    call_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    name: FunctionName | None = None
    arguments: Annotated[Text, Field(max_length=1_000_000)] | None = None
    # sent back with an earlier call (as the SDK names them): null is dropped; set, refused (plain calls only)
    namespace: Annotated[Refused, _refuse("namespaced tools are not supported by this gateway")]
    caller: Annotated[Refused, _refuse("program tool calls are not supported by the engines")]
    async_: Annotated[Refused, _refuse("asynchronous tool calls are not supported by the engines")]
    # function_call_output
    output: Text | None = None
    # reasoning
    summary: list[ReasoningText] | None = None
    encrypted_content: Annotated[Refused, _refuse("encrypted reasoning is not supported by the engines")]

    @model_validator(mode="after")
    def _check(self) -> InputItem:
        needs = {
            "message": ("role", "content"),
            "function_call": ("call_id", "name", "arguments"),
            "function_call_output": ("call_id", "output"),
            "reasoning": (),
        }[self.type]
        require(self, f"a {self.type} item", needs)
        return self

    def chat_text(self) -> str:
        """The text of a message item as vLLM reads it: an assistant's first part; otherwise the parts joined."""
        if isinstance(self.content, str):
            return self.content
        texts = [part.text or "" for part in self.content or [] if part.type != "refusal"]
        if self.role == "assistant":
            return texts[0] if texts else ""
        return "\n".join(texts)


class FunctionTool(_Strict):
    type: Literal["function"]
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(_Strict):
    type: Literal["function"]
    name: FunctionName


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> TextFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a json_schema format needs `schema`")
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None


class ReasoningConfig(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


# Fields the gateway acts on or accepts without passing on (background: only false or null get this far).
GATEWAY_ONLY = frozenset({"stream", "store", "background", "metadata", "service_tier", "safety_identifier"})


class ResponsesRequest(OwnShapeRequest):
    model: ModelName
    input: Text | Annotated[list[InputItem], Field(min_length=1, max_length=4096)]
    instructions: Text | None = None
    # passed (OpenAI)
    max_output_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    include: list[Literal["message.output_text.logprobs"]] | None = None
    truncation: Literal["disabled"] | None = None
    user: Annotated[Text, Field(max_length=256)] | None = None
    # gateway
    stream: bool | None = None
    # The worker's prefix_affinity key, as for chat; passed on (the pinned vLLM accepts it).
    prompt_cache_key: Annotated[Text, Field(max_length=1024)] | None = None
    # ignored: OpenAI-side features (billing tiers, abuse tracking); store only when false
    store: Annotated[
        bool | None, _refuse_true(f"store: true is not supported: {NOT_STORED}; send false or leave it out")
    ] = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    # passed (vLLM's own sampling parameters)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: StopText | Annotated[list[StopText], Field(max_length=4)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=64)] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    structured_outputs: StructuredOutputs | None = None
    chat_template_kwargs: dict[str, str | int | float | bool | None] | None = None
    # refused: they need responses kept on the server (NOT_STORED), or what the engines lack
    previous_response_id: Annotated[Refused, _refuse(f"previous_response_id is not supported: {NOT_STORED}")]
    conversation: Annotated[Refused, _refuse(f"conversation is not supported: {NOT_STORED}")]
    prompt: Annotated[Refused, _refuse("stored prompt templates are not supported: send the text in `input`")]
    background: Annotated[
        bool | None, _refuse_true("background: true is not supported; send `Prefer: respond-async` to queue a task")
    ] = None
    max_tool_calls: Annotated[Refused, _refuse("max_tool_calls applies to built-in tools, which the engines lack")]

    @model_validator(mode="after")
    def _check(self) -> ResponsesRequest:
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools")
        choice = self.tool_choice
        named = choice.name if isinstance(choice, NamedFunctionChoice) else None
        if named is not None and self.tools and named not in {tool.name for tool in self.tools}:
            raise ValueError(f"tool_choice names {named!r}, which is not in tools")
        if self.top_logprobs and not self.include:
            raise ValueError('top_logprobs needs include: ["message.output_text.logprobs"]')
        if self.text is not None and self.text.format is not None and self.structured_outputs is not None:
            raise ValueError("use text.format or structured_outputs, not both")
        return self

    max_tokens_field: ClassVar[str] = "max_output_tokens"
    input_param: ClassVar[str] = "input"
    gateway_only: ClassVar[frozenset[str]] = GATEWAY_ONLY

    def engine_payload(self) -> dict[str, Any]:
        payload = super().engine_payload()
        # The engines store nothing either: say so, rather than rely on their default (store: true, ignored).
        payload["store"] = False
        return payload

    def chat_view(self) -> dict[str, Any]:
        """The chat vLLM makes of this request, for the length check: messages, tools, template controls."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        items = self.input
        if isinstance(items, str):
            items = [InputItem.model_validate({"role": "user", "content": items})]
        for item in items:
            _add_chat_message(messages, item)
        last = items[-1]
        continue_final = last.type in ("message", "reasoning") and last.status in ("in_progress", "incomplete")
        tools = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in self.tools or []
        ]
        return {
            "messages": messages,
            "tools": tools or None,
            "continue_final_message": continue_final,
            "reasoning_effort": self.reasoning.effort if self.reasoning else None,
            "chat_template_kwargs": self.chat_template_kwargs,
        }


def _add_chat_message(messages: list[dict[str, Any]], item: InputItem) -> None:
    """Append item to the chat as vLLM 0.32 does (an assistant's call, reasoning and text share one message)."""
    previous = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
    if item.type == "function_call":
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        if previous is not None:
            previous.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif item.type == "function_call_output":
        messages.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
    elif item.type == "reasoning":
        parts = item.content if item.content else item.summary
        text = parts[0].text if isinstance(parts, list) and parts else ""
        if previous is not None and previous.get("reasoning") is None:
            previous["reasoning"] = text
        else:
            messages.append({"role": "assistant", "content": None, "reasoning": text})
    elif item.role == "assistant" and previous is not None and previous.get("content") is None:
        previous["content"] = item.chat_text()
    else:
        messages.append({"role": item.role, "content": item.chat_text()})
