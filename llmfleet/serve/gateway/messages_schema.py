"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API): the fields the pinned vLLM serves.

As for chat (schemas.py), each field is passed, ignored or refused; unknown
fields are refused. Content blocks: text, tool_use and tool_result,
thinking (sent back from an earlier answer), redacted_thinking (dropped, as
vLLM does); images, documents, search results and server tools are refused:
the served models read text. `cache_control` is accepted and ignored (vLLM
caches prefixes by itself). `container`, `mcp_servers`, `context_management`
and the like are unknown fields here, so a 400 names them.

The length check counts the chat vLLM 0.32 makes of the request: the system
prompt as one system message, text blocks as text, tool_use blocks as the
assistant's tool calls, tool_result blocks as tool messages before the rest
of their user turn.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from llmfleet.serve.gateway.schemas import FunctionName, ModelName, OwnShapeRequest, StopText, Text, _Strict, require

# Claude Code's per-request attribution line, which vLLM drops from the system prompt (it defeats prefix caching).
BILLING_HEADER = "x-anthropic-billing-header"


class TextBlock(_Strict):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = None


class ContentBlock(_Strict):
    type: Literal[
        "text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document", "search_result"
    ]
    cache_control: dict[str, Any] | None = None
    # text
    text: Text | None = None
    citations: list[Any] | None = None
    # tool_use
    id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    name: FunctionName | None = None
    input: dict[str, Any] | None = None
    # tool_result
    tool_use_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    content: Text | list[ToolResultBlock] | None = None
    is_error: bool | None = None
    # thinking
    thinking: Text | None = None
    signature: str | None = None
    # redacted_thinking
    data: str | None = None
    # refused kinds
    source: Any = None
    title: Any = None
    context: Any = None

    @model_validator(mode="after")
    def _check(self) -> ContentBlock:
        if self.type in ("image", "document", "search_result"):
            raise ValueError(f"content blocks of type {self.type!r} are not supported: the served models read text")
        needs = {
            "text": ("text",),
            "tool_use": ("id", "name", "input"),
            "tool_result": ("tool_use_id",),
            "thinking": ("thinking",),
            "redacted_thinking": (),
        }[self.type]
        require(self, f"a {self.type} block", needs)
        return self

    def result_text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content or [])


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[ContentBlock], Field(max_length=4096)]

    @model_validator(mode="after")
    def _check(self) -> Message:
        if isinstance(self.content, list):
            kinds = {block.type for block in self.content}
            if self.role == "user" and kinds & {"tool_use", "thinking", "redacted_thinking"}:
                raise ValueError("tool_use and thinking blocks belong to assistant messages")
            if self.role == "assistant" and "tool_result" in kinds:
                raise ValueError("tool_result blocks belong to user messages")
        return self


class Tool(_Strict):
    type: Literal["custom"] | None = None
    name: FunctionName
    description: Text | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type tool needs `name`")
        return self


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class Thinking(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1024)
    display: Literal["summarized", "omitted", "updates"] | None = None

    @model_validator(mode="after")
    def _check(self) -> Thinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("thinking of type enabled needs budget_tokens")
        return self


# Fields the gateway acts on or accepts without passing on.
GATEWAY_ONLY = frozenset({"stream", "metadata", "service_tier"})


class _Conversation(_Strict):
    """What count_tokens and a message request share: the conversation, its tools and template controls."""

    model: ModelName
    messages: Annotated[list[Message], Field(min_length=1, max_length=4096)]
    system: Text | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # vLLM's own template controls
    chat_template_kwargs: dict[str, str | int | float | bool | None] | None = None

    @model_validator(mode="after")
    def _check_tools(self) -> _Conversation:
        named = self.tool_choice.name if self.tool_choice is not None and self.tool_choice.type == "tool" else None
        if named is not None and named not in {tool.name for tool in self.tools or []}:
            raise ValueError(f"tool_choice names {named!r}, which is not in tools")
        return self

    def chat_view(self) -> dict[str, Any]:
        """The chat vLLM makes of this request, for the length check: messages, tools, template controls."""
        messages: list[dict[str, Any]] = []
        system = self.system if isinstance(self.system, str) else _joined(self.system or [])
        if system:
            messages.append({"role": "system", "content": system})
        for message in self.messages:
            _add_chat_messages(messages, message)
        tools = [
            {
                "type": "function",
                "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema},
            }
            for tool in self.tools or []
        ]
        effort = self.output_config.effort if self.output_config else None
        return {
            "messages": messages,
            "tools": tools or None,
            "reasoning_effort": "none" if self.thinking and self.thinking.type == "disabled" else effort,
            "chat_template_kwargs": self.chat_template_kwargs,
        }


def _joined(blocks: list[TextBlock]) -> str:
    return "".join(block.text for block in blocks if block.text and not block.text.startswith(BILLING_HEADER))


def _add_chat_messages(messages: list[dict[str, Any]], message: Message) -> None:
    """Append message to the chat as vLLM 0.32 does: tool results become tool messages ahead of the turn's text."""
    if isinstance(message.content, str):
        messages.append({"role": message.role, "content": message.content})
        return
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in message.content:
        if block.type == "text" and block.text:
            texts.append(block.text)
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            arguments = json.dumps(block.input or {})
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif block.type == "tool_result":
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.result_text()})
    chat: dict[str, Any] = {"role": message.role}
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if texts:
        chat["content"] = texts[0] if len(texts) == 1 else [{"type": "text", "text": text} for text in texts]
    if "content" in chat or (message.role == "assistant" and (calls or reasoning)):
        chat.setdefault("content", None)
        messages.append(chat)


class MessagesRequest(_Conversation, OwnShapeRequest):
    # passed
    max_tokens: int = Field(ge=1, le=1_000_000)
    stop_sequences: Annotated[list[StopText], Field(max_length=16)] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    # gateway
    stream: bool | None = None
    # ignored: Anthropic-side features (its user tracking, its capacity tiers)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _check_thinking(self) -> MessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and budget >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self

    max_tokens_field: ClassVar[str] = "max_tokens"
    input_param: ClassVar[str] = "messages"
    gateway_only: ClassVar[frozenset[str]] = GATEWAY_ONLY


class CountTokensRequest(_Conversation):
    pass
