"""Validation before queueing: the model, the prompt's length in the model's own tokens, max_tokens.

Token counts use the served model's tokenizer.json (the `tokenizers` library,
the same Rust tokenizer vLLM's fast tokenizer wraps):

- completions: the prompt encoded as vLLM does (with the tokenizer's own
  special-token post-processing); a prompt of token ids is counted as given;
- chat: the messages rendered with ChatML, the template of Qwen2 chat models
  and of the project's tiny model, then encoded without extra special tokens:

      <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n

  A model whose chat template is not ChatML gets a count that may differ by a
  few tokens per message; the engine still refuses anything that does not fit,
  and that 400 reaches the client as well.

prompt tokens + max_tokens must fit max_model_len (the engines' own figure,
else config.json's max_position_embeddings, else the operator's override).
Otherwise the answer is a 400 naming both numbers, or, if the operator set
LLMFLEET_GATEWAY_TRUNCATE_PROMPTS, the prompt is cut to fit: a completion
prompt keeps its last tokens; a chat drops its oldest non-system messages
(never the last one) until it fits.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

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

    def max_model_len(self, engine_max_len: int) -> int:
        """The operator's override, else what the engines report, else config.json."""
        if self.override_max_len:
            return self.override_max_len
        if engine_max_len > 0:
            return engine_max_len
        if self.config_max_len:
            return self.config_max_len
        raise APIError(503, f"max_model_len of model {self.name!r} is unknown", "server_error", "model_unavailable")


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
        try:
            config = json.loads(config_file.read_text())
            value = config.get("max_position_embeddings")
            config_max_len = int(value) if value else None
        except (ValueError, TypeError, AttributeError) as error:
            raise SettingsError(f"model {name!r}: {config_file} is not valid JSON: {error}") from None
    return ModelInfo(
        name=name,
        path=path,
        tokenizer=tokenizer,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        config_max_len=config_max_len,
        override_max_len=override_max_len,
    )


def message_text(content: str | list[dict[str, Any]] | None) -> str:
    """The text of a message's content: a string, or OpenAI content parts of type "text"."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


def render_chatml(messages: list[dict[str, Any]]) -> str:
    rendered = "".join(
        f"<|im_start|>{message['role']}\n{message_text(message.get('content'))}<|im_end|>\n" for message in messages
    )
    return rendered + "<|im_start|>assistant\n"


async def _encode(tokenizer: Tokenizer, text: str, *, special: bool) -> list[int]:
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return list(tokenizer.encode(text, add_special_tokens=special).ids)
    encoding = await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=special)
    return list(encoding.ids)


def context_error(prompt_tokens: int, max_tokens: int, max_model_len: int, param: str) -> APIError:
    return APIError(
        400,
        f"the prompt is {prompt_tokens} tokens and max_tokens is {max_tokens}: {prompt_tokens + max_tokens} tokens"
        f" do not fit this model's context of {max_model_len} tokens; shorten the prompt or lower max_tokens",
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


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int, cap: int, param: str) -> int:
    if requested is not None:
        if requested > cap:
            raise APIError(
                400,
                f"max_tokens is {requested}, more than this gateway's cap of {cap}",
                "invalid_request_error",
                "max_tokens_too_large",
                param="max_tokens",
            )
        return requested
    room = max_model_len - prompt_tokens
    if room < 1:
        raise context_error(prompt_tokens, 1, max_model_len, param)
    return min(cap, room)


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
    max_tokens = resolve_max_tokens(requested, len(ids), max_model_len, cap, "prompt")
    if len(ids) + max_tokens <= max_model_len:
        return Checked({**payload, "max_tokens": max_tokens}, len(ids), max_tokens)
    keep = max_model_len - max_tokens
    if not truncate or keep < 1:
        raise context_error(len(ids), max_tokens, max_model_len, "prompt")
    return Checked({**payload, "prompt": ids[-keep:], "max_tokens": max_tokens}, keep, max_tokens, len(ids) - keep)


async def check_chat(
    model: ModelInfo, payload: dict[str, Any], requested: int | None, max_model_len: int, cap: int, truncate: bool
) -> Checked:
    messages: list[dict[str, Any]] = payload["messages"]
    original = count = len(await _encode(model.tokenizer, render_chatml(messages), special=False))
    max_tokens = resolve_max_tokens(requested, count, max_model_len, cap, "messages")
    if count + max_tokens <= max_model_len:
        return Checked({**payload, "max_tokens": max_tokens}, count, max_tokens)
    if not truncate:
        raise context_error(count, max_tokens, max_model_len, "messages")
    kept = list(messages)
    while count + max_tokens > max_model_len:
        droppable = [i for i, message in enumerate(kept[:-1]) if message.get("role") not in ("system", "developer")]
        if not droppable:
            raise context_error(count, max_tokens, max_model_len, "messages")
        del kept[droppable[0]]
        count = len(await _encode(model.tokenizer, render_chatml(kept), special=False))
    return Checked({**payload, "messages": kept, "max_tokens": max_tokens}, count, max_tokens, original - count)
