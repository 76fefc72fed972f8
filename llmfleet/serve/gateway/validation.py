"""Validation before queueing: the model, the prompt's length in the model's own tokens, max_tokens.

Token counts use the served model's tokenizer.json (the `tokenizers` library,
the same Rust tokenizer vLLM's fast tokenizer wraps):

- completions: the prompt encoded as vLLM does (with the tokenizer's own
  special-token post-processing); a prompt of token ids is counted as given;
- chat: the messages (and tools) rendered with the model's own chat template
  (chat_template.jinja, else tokenizer_config.json's chat_template) exactly
  as vLLM renders it (llmfleet.serve.gateway.chat_template), then encoded
  without extra special tokens.

The context rule is vLLM 0.32's own, so that the gateway and the engine never
disagree: the prompt must leave room for at least one token (prompt tokens <
max_model_len), and max_tokens is clamped to the room left (vLLM's
get_max_tokens does the same), so a request whose prompt + max_tokens run past
the context is served, with finish_reason "length" at the context's end.
max_model_len is the operator's override, else the engines' own figure, else
config.json's max_position_embeddings. A prompt with no room left is a 400
naming both numbers, or, if the operator set LLMFLEET_GATEWAY_TRUNCATE_PROMPTS,
it is cut so that the requested max_tokens fits: a completion prompt keeps its
last tokens; a chat drops its oldest turns (never system or developer
messages, never the last message; an assistant's tool calls go together with
their tool results).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from llmfleet.serve.gateway.chat_template import ChatTemplate, TemplateError
from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.queue.config import SettingsError

# Above this many characters, tokenizing moves off the event loop.
INLINE_TOKENIZE_CHARS = 4096


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: Path
    tokenizer: Tokenizer
    vocab_size: int
    config_max_len: int | None
    override_max_len: int | None
    chat_template: ChatTemplate | None = None

    def max_model_len(self, engine_max_len: int) -> int:
        """The operator's override, else what the engines report, else config.json."""
        if self.override_max_len:
            return self.override_max_len
        if engine_max_len > 0:
            return engine_max_len
        if self.config_max_len:
            return self.config_max_len
        raise APIError(503, f"max_model_len of model {self.name!r} is unknown", "server_error", "model_unavailable")


def _read_json(name: str, file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise SettingsError(f"model {name!r}: {file} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"model {name!r}: {file} is not a JSON object")
    return data


def load_template(name: str, path: Path) -> ChatTemplate | None:
    """The model's chat template: chat_template.jinja if present (as transformers prefers), else the config's."""
    config_file = path / "tokenizer_config.json"
    config = _read_json(name, config_file) if config_file.is_file() else {}
    jinja_file = path / "chat_template.jinja"
    try:
        source = jinja_file.read_text() if jinja_file.is_file() else None
        return ChatTemplate.from_tokenizer_config(config, source)
    except TemplateError as error:
        raise SettingsError(f"model {name!r}: its chat template does not compile: {error}") from None


def load_model(name: str, path: Path, override_max_len: int | None = None) -> ModelInfo:
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise SettingsError(f"model {name!r}: {tokenizer_file} does not exist; the gateway counts tokens with it")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as error:  # the tokenizers library raises its own Exception subclass
        raise SettingsError(f"model {name!r}: cannot load {tokenizer_file}: {error}") from None
    config_max_len = None
    config_file = path / "config.json"
    if config_file.is_file():
        value = _read_json(name, config_file).get("max_position_embeddings")
        try:
            config_max_len = int(value) if value else None
        except (TypeError, ValueError):
            raise SettingsError(f"model {name!r}: max_position_embeddings {value!r} is not a number") from None
    return ModelInfo(
        name=name,
        path=path,
        tokenizer=tokenizer,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        config_max_len=config_max_len,
        override_max_len=override_max_len,
        chat_template=load_template(name, path),
    )


async def _encode(tokenizer: Tokenizer, text: str, *, special: bool) -> list[int]:
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return list(tokenizer.encode(text, add_special_tokens=special).ids)
    encoding = await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=special)
    return list(encoding.ids)


def context_error(prompt_tokens: int, max_tokens: int | None, max_model_len: int, param: str) -> APIError:
    wanted = f" and max_tokens is {max_tokens}" if max_tokens is not None else ""
    return APIError(
        400,
        f"the prompt is {prompt_tokens} tokens{wanted}: this model's context of {max_model_len} tokens"
        " leaves no room for an answer; shorten the prompt",
        "invalid_request_error",
        "context_length_exceeded",
        param=param,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        max_model_len=max_model_len,
    )


@dataclass(frozen=True)
class Checked:
    """A request that fits: its (possibly truncated) payload, prompt tokens and resolved max_tokens."""

    payload: dict[str, Any]
    prompt_tokens: int
    max_tokens: int
    truncated_tokens: int = 0


def check_cap(requested: int | None, cap: int) -> None:
    if requested is not None and requested > cap:
        raise APIError(
            400,
            f"max_tokens is {requested}, more than this gateway's cap of {cap}",
            "invalid_request_error",
            "max_tokens_too_large",
            param="max_tokens",
        )


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int, cap: int, param: str) -> int:
    """max_tokens as the engine will use it: the request's (or the cap), clamped to the room the prompt leaves."""
    check_cap(requested, cap)
    room = max_model_len - prompt_tokens
    if room < 1:
        raise context_error(prompt_tokens, requested, max_model_len, param)
    return min(requested if requested is not None else cap, room)


def _fits(payload: dict[str, Any], prompt_tokens: int, max_tokens: int, truncated: int = 0) -> Checked:
    min_tokens = payload.get("min_tokens")
    if min_tokens is not None and min_tokens > max_tokens:
        raise APIError(
            400,
            f"min_tokens is {min_tokens}, but only {max_tokens} tokens fit after the prompt",
            param="min_tokens",
        )
    return Checked({**payload, "max_tokens": max_tokens}, prompt_tokens, max_tokens, truncated)


async def check_completion(
    model: ModelInfo, payload: dict[str, Any], requested: int | None, max_model_len: int, cap: int, truncate: bool
) -> Checked:
    prompt = payload["prompt"]
    if isinstance(prompt, str):
        ids = await _encode(model.tokenizer, prompt, special=True)
    else:
        ids = list(prompt)
        bad = next((token for token in ids if not 0 <= token < model.vocab_size), None)
        if bad is not None:
            raise APIError(
                400, f"token id {bad} is outside the vocabulary (0 to {model.vocab_size - 1})", param="prompt"
            )
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    check_cap(requested, cap)
    if truncate and requested is not None and len(ids) + requested > max_model_len:
        keep = max_model_len - requested
        if keep >= 1:
            return _fits({**payload, "prompt": ids[-keep:]}, keep, requested, len(ids) - keep)
    if truncate and requested is None and len(ids) >= max_model_len:
        keep = max_model_len - 1
        return _fits({**payload, "prompt": ids[-keep:]}, keep, 1, len(ids) - keep)
    return _fits(payload, len(ids), resolve_max_tokens(requested, len(ids), max_model_len, cap, "prompt"))


def _render(model: ModelInfo, payload: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    template = model.chat_template
    if template is None:
        raise APIError(
            400,
            f"model {model.name!r} has no chat template; use /v1/completions",
            "invalid_request_error",
            "chat_template_missing",
            param="messages",
        )
    # vLLM renders the tools even with tool_choice "none" (--exclude-tools-when-tool-choice-none is off).
    tools = payload.get("tools")
    continue_final = bool(payload.get("continue_final_message"))
    add_generation = payload.get("add_generation_prompt")
    try:
        return template.render(
            messages,
            tools,
            add_generation_prompt=(not continue_final) if add_generation is None else bool(add_generation),
            continue_final_message=continue_final,
            reasoning_effort=payload.get("reasoning_effort"),
            kwargs=payload.get("chat_template_kwargs"),
        )
    except TemplateError as error:
        # The template itself refused the conversation (raise_exception): the engine would too.
        raise APIError(400, f"the model's chat template refused these messages: {error}", param="messages") from None


async def _count_chat(model: ModelInfo, payload: dict[str, Any], messages: list[dict[str, Any]]) -> int:
    return len(await _encode(model.tokenizer, _render(model, payload, messages), special=False))


def _drop_units(messages: list[dict[str, Any]]) -> list[list[int]]:
    """Indexes of what truncation may drop, oldest first: one turn, or an assistant's tool calls with their results."""
    units: list[list[int]] = []
    last = len(messages) - 1
    index = 0
    while index < last:
        message = messages[index]
        if message.get("role") in ("system", "developer"):
            index += 1
            continue
        unit = [index]
        if message.get("role") == "assistant" and message.get("tool_calls"):
            while index + 1 < last and messages[index + 1].get("role") == "tool":
                index += 1
                unit.append(index)
        units.append(unit)
        index += 1
    return units


async def check_chat(
    model: ModelInfo, payload: dict[str, Any], requested: int | None, max_model_len: int, cap: int, truncate: bool
) -> Checked:
    messages: list[dict[str, Any]] = payload["messages"]
    count = await _count_chat(model, payload, messages)
    check_cap(requested, cap)
    wanted = requested if requested is not None else 1
    if count + wanted <= max_model_len or not truncate:
        return _fits(payload, count, resolve_max_tokens(requested, count, max_model_len, cap, "messages"))
    # Truncation: each droppable turn is rendered and encoded once on its own to estimate what dropping it
    # saves; the conversation is encoded again only to confirm (and, if the estimate fell short, once more
    # per extra turn dropped), never once per dropped message.
    budget = max_model_len - wanted
    units = _drop_units(messages)
    framing = await _count_chat(model, {}, [])
    costs = [sum([await _turn_cost(model, messages[i], framing) for i in unit]) for unit in units]
    dropped: set[int] = set()
    estimate = count
    for unit, cost in zip(units, costs, strict=True):
        if estimate <= budget:
            break
        dropped.update(unit)
        estimate -= cost
    while True:
        kept = [message for i, message in enumerate(messages) if i not in dropped]
        kept_count = await _count_chat(model, payload, kept)
        if kept_count <= budget:
            break
        remaining = [unit for unit in units if not dropped.issuperset(unit)]
        if not remaining:
            raise context_error(kept_count, requested, max_model_len, "messages")
        dropped.update(remaining[0])
    max_tokens = resolve_max_tokens(requested, kept_count, max_model_len, cap, "messages")
    return _fits({**payload, "messages": kept}, kept_count, max_tokens, count - kept_count)


async def _turn_cost(model: ModelInfo, message: dict[str, Any], framing: int) -> int:
    """About what one message adds to the prompt: rendered alone, less the template's fixed framing.

    A template that refuses a lone message (one that insists on alternating
    roles, say) gets the message's text encoded instead.
    """
    try:
        return max(await _count_chat(model, {}, [message]) - framing, 0)
    except APIError:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        return len(await _encode(model.tokenizer, text, special=False))


async def count_chat_view(model: ModelInfo, view: dict[str, Any]) -> int:
    """Prompt tokens of a Responses or Messages request: the chat vLLM makes of it (its `chat_view`), rendered."""
    return await _count_chat(model, view, view["messages"])


async def check_translated(
    model: ModelInfo,
    payload: dict[str, Any],
    view: dict[str, Any],
    requested: int | None,
    max_model_len: int,
    cap: int,
    *,
    field: str,
    param: str,
) -> Checked:
    """A Responses or Messages request: counted as its chat, max tokens resolved into `field`.

    No truncation (LLMFLEET_GATEWAY_TRUNCATE_PROMPTS is for chat and
    completions): the engine gets these requests in their own shape, so a
    prompt with no room left is a 400.
    """
    count = await count_chat_view(model, view)
    max_tokens = resolve_max_tokens(requested, count, max_model_len, cap, param)
    return Checked({**payload, field: max_tokens}, count, max_tokens)
