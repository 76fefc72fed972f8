"""A model's own chat template, rendered as vLLM renders it, to count a chat's prompt tokens.

vLLM (0.32) turns an OpenAI chat request into a prompt in two steps, and the
gateway repeats both so that its count is the engine's count:

1. the messages become the template's `messages` (vllm.renderers.chat_utils):
   text parts joined with "\\n" (content None: ""), for templates that read
   content as a string; an assistant's tool call arguments parsed from their
   JSON string into a mapping (not valid JSON, or not an object: {}); a
   tool message keeps tool_call_id; `name` kept; `tools` become
   {"type": "function", "function": {"name", "description", "parameters"}}
   ("strict" only when set), or None with no tools;
2. transformers renders the template in a sandboxed Jinja environment with
   trim_blocks and lstrip_blocks, the loopcontrols extension, a `tojson`
   filter that keeps non-ASCII text, and the globals raise_exception and
   strftime_now; the keyword arguments are the tokenizer's special tokens,
   add_generation_prompt, documents, reasoning_effort (enable_thinking when
   it is set) and the request's chat_template_kwargs. The prompt is then
   encoded WITHOUT the tokenizer's own special tokens (add_special_tokens is
   false for chat in vLLM).

A template that loops over a message's content parts (vLLM's "openai" content
format) gets the parts as given instead of joined text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
from jinja2.exceptions import TemplateError

__all__ = ["ChatTemplate", "TemplateError", "template_messages", "template_tools"]


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012  # jinja2's own class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # `format`: the name templates call it with
    return datetime.now().strftime(format)  # as transformers does: the host's local time


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _loops_over_content(node: jinja2.nodes.Node) -> bool:
    """Whether the template iterates a message's content (vLLM's "openai" content format)."""
    for loop in node.find_all(jinja2.nodes.For):
        target = loop.iter
        while isinstance(target, jinja2.nodes.Filter | jinja2.nodes.Test) and target.node is not None:
            target = target.node
        if (
            isinstance(target, jinja2.nodes.Getitem)
            and isinstance(target.arg, jinja2.nodes.Const)
            and target.arg.value == "content"
        ):
            return True
        if isinstance(target, jinja2.nodes.Getattr) and target.attr == "content":
            return True
    return False


def _arguments(value: Any) -> dict[str, Any]:
    """A tool call's arguments as the template sees them: a mapping, as vLLM makes it."""
    if isinstance(value, dict):
        return value
    if not value:
        return {}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def template_messages(messages: list[dict[str, Any]], *, parts: bool = False) -> list[dict[str, Any]]:
    """The template's `messages`, from the engine payload's messages (as vLLM's parse_chat_messages makes them)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        content = message.get("content")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        texts = [str(part.get("text", "")) for part in content if part.get("type") == "text"]
        rendered: dict[str, Any] = {"role": role}
        if parts:
            rendered["content"] = [{"type": "text", "text": text} for text in texts]
        elif role == "tool":
            rendered["content"] = "\n".join(texts) if texts else ""
        else:
            rendered["content"] = "\n".join(texts)
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls:
                rendered["tool_calls"] = [
                    {
                        **call,
                        "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))},
                    }
                    for call in calls
                ]
            if message.get("reasoning") is not None:
                rendered["reasoning"] = rendered["reasoning_content"] = message["reasoning"]
        elif role == "tool" and "tool_call_id" in message:
            rendered["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            rendered["name"] = message["name"]
        if role == "developer":
            rendered["tools"] = message.get("tools")
        out.append(rendered)
    return out


def template_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The template's `tools`: what vLLM's ChatCompletionToolsParam.model_dump() gives."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        function = tool["function"]
        dumped: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            dumped["strict"] = function["strict"]
        out.append({"type": "function", "function": dumped})
    return out


class ChatTemplate:
    """One model's chat template with the special tokens its tokenizer_config.json names."""

    def __init__(self, source: str, special_tokens: Mapping[str, Any]) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens)
        env = _environment()
        self.template = env.from_string(source)
        self.parts = _loops_over_content(env.parse(source))

    @classmethod
    def from_tokenizer_config(cls, config: Mapping[str, Any], template_file: str | None = None) -> ChatTemplate | None:
        """The template of a tokenizer_config.json (or of a chat_template.jinja beside it); None if it has none."""
        source = template_file if template_file is not None else config.get("chat_template")
        if isinstance(source, list):  # named templates: vLLM uses "default"
            named = {item.get("name"): item.get("template") for item in source if isinstance(item, dict)}
            source = named.get("default")
        if not isinstance(source, str) or not source:
            return None
        special: dict[str, Any] = {}
        for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
            value = config.get(key)
            if isinstance(value, dict):  # an AddedToken written out
                value = value.get("content")
            if isinstance(value, str):
                special[key] = value
        extra = config.get("additional_special_tokens")
        if isinstance(extra, list):
            special["additional_special_tokens"] = [
                token.get("content") if isinstance(token, dict) else token for token in extra
            ]
        return cls(source, special)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        reasoning_effort: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text vLLM would make of these engine-payload messages and tools."""
        conversation = template_messages(messages, parts=self.parts)
        extra: dict[str, Any] = {
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "documents": None,
            "reasoning_effort": reasoning_effort,
        }
        user = dict(kwargs or {})
        if reasoning_effort is not None and "enable_thinking" not in user:
            extra["enable_thinking"] = reasoning_effort != "none"
        variables = {**self.special_tokens, **user, **extra}
        variables["messages"] = conversation
        variables["tools"] = template_tools(tools)
        rendered = self.template.render(**variables)
        if continue_final_message and conversation:
            # As transformers does: cut the prompt right after the final message's text.
            final = conversation[-1]["content"]
            text = final if isinstance(final, str) else "".join(part["text"] for part in final)
            if text.strip() and text.strip() in rendered:
                end = rendered.rindex(text.strip()) + len(text.strip())
                rendered = rendered[:end]
        return rendered
