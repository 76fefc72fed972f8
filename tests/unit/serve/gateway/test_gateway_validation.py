"""Validation before queueing: tokens counted with the model's own chat template, the context rule, truncation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from llmfleet.lab.tiny import CHAT_TEMPLATE
from llmfleet.serve.gateway import validation
from llmfleet.serve.gateway.chat_template import ChatTemplate
from llmfleet.serve.gateway.errors import APIError
from llmfleet.serve.gateway.validation import ModelInfo, check_chat, check_completion, load_model


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> ModelInfo:
    return load_model("tiny", tiny_dir)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def encoded(model: ModelInfo, text: str) -> int:
    return len(model.tokenizer.encode(text, add_special_tokens=False).ids)


def test_the_model_info_comes_from_the_model_directory(model: ModelInfo) -> None:
    assert model.config_max_len == 2048
    assert model.max_model_len(0) == 2048  # no engine report: config.json
    assert model.max_model_len(1024) == 1024  # the engine's own figure wins
    assert model.vocab_size > 256
    assert model.chat_template is not None and model.chat_template.source == CHAT_TEMPLATE


def test_a_chat_is_counted_with_the_models_own_template(model: ModelInfo) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
    ]
    checked = run(check_chat(model, {"messages": messages}, 8, 2048, 4096, False))
    # Text parts are joined with a newline, as vLLM does for a template that reads content as a string.
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n"
    assert checked.prompt_tokens == encoded(model, rendered)
    assert model.tokenizer.encode("<|im_start|>", add_special_tokens=False).ids == [1]
    assert checked.max_tokens == 8 and checked.payload["max_tokens"] == 8


def test_tools_and_tool_results_count_as_the_template_renders_them(model: ModelInfo) -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert model.chat_template is not None
    rendered = model.chat_template.render(messages, tools)
    # The tool as vLLM dumps it (description null), the call's arguments as a mapping, the result a user turn.
    assert '{"type": "function", "function": {"name": "weather", "description": null, "parameters"' in rendered
    assert '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in rendered
    with_tools = run(check_chat(model, {"messages": messages, "tools": tools}, 8, 2048, 4096, False))
    without = run(check_chat(model, {"messages": messages}, 8, 2048, 4096, False))
    assert with_tools.prompt_tokens == encoded(model, rendered)
    assert with_tools.prompt_tokens > without.prompt_tokens + 50


def test_a_template_that_loops_over_content_parts_gets_them() -> None:
    source = "{% for m in messages %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endfor %}"
    template = ChatTemplate(source, {})
    assert template.parts
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert template.render(messages, None) == "[a][b]"
    assert not ChatTemplate(CHAT_TEMPLATE, {}).parts


@pytest.mark.parametrize(
    ("requested", "room", "expected"),
    [
        (16, 100, 16),  # fits
        (500, 100, 100),  # past the context: clamped to the room left, as vLLM 0.32 does
        (None, 100, 100),  # no max_tokens: the room left
    ],
)
def test_max_tokens_is_clamped_to_the_room_the_prompt_leaves(
    model: ModelInfo, requested: int | None, room: int, expected: int
) -> None:
    prompt_tokens = len(model.tokenizer.encode("hi").ids)
    checked = run(check_completion(model, {"prompt": "hi"}, requested, prompt_tokens + room, 4096, False))
    assert checked.max_tokens == expected and checked.payload["max_tokens"] == expected


def test_a_prompt_with_no_room_left_is_refused_naming_both_numbers(model: ModelInfo) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 300
    tokens = len(model.tokenizer.encode(prompt).ids)
    with pytest.raises(APIError) as error:
        run(check_completion(model, {"prompt": prompt}, 16, 2048, 4096, False))
    assert error.value.status == 400 and error.value.code == "context_length_exceeded"
    assert f"the prompt is {tokens} tokens and max_tokens is 16" in error.value.message
    assert "context of 2048 tokens" in error.value.message
    assert error.value.extra == {"prompt_tokens": tokens, "max_tokens": 16, "max_model_len": 2048}
    ids = [5] * 100
    assert run(check_completion(model, {"prompt": ids}, 16, 101, 4096, False)).max_tokens == 1
    with pytest.raises(APIError, match="leaves no room"):
        run(check_completion(model, {"prompt": ids}, 16, 100, 4096, False))


def test_max_tokens_cap_and_min_tokens(model: ModelInfo) -> None:
    with pytest.raises(APIError, match="more than this gateway's cap of 100"):
        run(check_completion(model, {"prompt": "hi"}, 101, 2048, 100, False))
    checked = run(check_completion(model, {"prompt": "hi"}, None, 2048, 64, False))
    assert checked.max_tokens == 64
    with pytest.raises(APIError, match="min_tokens is 50, but only 10 tokens fit") as error:
        run(check_completion(model, {"prompt": [5] * 90, "min_tokens": 50}, 60, 100, 4096, False))
    assert error.value.param == "min_tokens"


def test_truncation_when_the_operator_opts_in(model: ModelInfo) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 300
    ids = model.tokenizer.encode(prompt).ids
    checked = run(check_completion(model, {"prompt": prompt}, 48, 2048, 4096, True))
    assert checked.payload["prompt"] == ids[-2000:]  # the last tokens, sent as token ids
    assert (checked.prompt_tokens, checked.truncated_tokens) == (2000, len(ids) - 2000)

    old = [{"role": "user", "content": "The quick brown fox. " * 200}, {"role": "assistant", "content": "ok"}]
    messages = [{"role": "system", "content": "Be brief."}, *old, {"role": "user", "content": "And now?"}]
    checked = run(check_chat(model, {"messages": messages}, 64, 512, 4096, True))
    assert [m["content"] for m in checked.payload["messages"]] == ["Be brief.", "ok", "And now?"]
    assert checked.prompt_tokens + 64 <= 512 and checked.truncated_tokens > 0
    with pytest.raises(APIError, match="leaves no room"):
        run(check_chat(model, {"messages": [{"role": "user", "content": "fox " * 600}]}, 64, 512, 4096, True))


def test_chat_truncation_does_not_encode_the_conversation_once_per_dropped_turn(
    model: ModelInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = []
    for index in range(60):
        turns += [
            {"role": "user", "content": f"Question {index}: the quick brown fox jumps over the lazy dog."},
            {"role": "assistant", "content": f"Answer {index}: hello, world!"},
        ]
    messages = [{"role": "system", "content": "Be brief."}, *turns, {"role": "user", "content": "And now?"}]
    whole = sum(len(m["content"]) for m in messages)
    encodes: list[int] = []
    original = validation._encode

    async def counting(tokenizer: Tokenizer, text: str, *, special: bool) -> list[int]:
        encodes.append(len(text))
        return await original(tokenizer, text, special=special)

    monkeypatch.setattr(validation, "_encode", counting)
    checked = run(check_chat(model, {"messages": messages}, 32, 512, 4096, True))
    assert checked.prompt_tokens + 32 <= 512
    dropped = len(messages) - len(checked.payload["messages"])
    assert dropped > 50
    # Whole-conversation encodes: the first count and the check of the result, not one per dropped turn.
    assert sum(1 for size in encodes if size > whole // 4) <= 3
    assert checked.prompt_tokens == encoded(model, model.chat_template.render(checked.payload["messages"], None))  # type: ignore[union-attr]


def test_truncation_drops_a_tool_call_together_with_its_result(model: ModelInfo) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "fox " * 300},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "result", "tool_call_id": "c1"},
        {"role": "user", "content": "fox " * 200},
        {"role": "user", "content": "last"},
    ]
    checked = run(check_chat(model, {"messages": messages}, 16, 300, 4096, True))
    roles = [m["role"] for m in checked.payload["messages"]]
    assert "tool" not in roles or "assistant" in roles
    assert checked.payload["messages"][-1]["content"] == "last"


def test_token_id_prompts_are_checked_against_the_vocabulary(model: ModelInfo) -> None:
    assert run(check_completion(model, {"prompt": [1, 2, 3]}, 4, 2048, 4096, False)).prompt_tokens == 3
    with pytest.raises(APIError, match="outside the vocabulary"):
        run(check_completion(model, {"prompt": [1, 10**6]}, 4, 2048, 4096, False))


def test_a_model_without_a_chat_template_refuses_chat(model: ModelInfo, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((model.path / name).read_bytes())
    config = json.loads((model.path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    bare = load_model("bare", tmp_path)
    with pytest.raises(APIError, match="no chat template") as error:
        run(check_chat(bare, {"messages": [{"role": "user", "content": "hi"}]}, 4, 2048, 4096, False))
    assert error.value.status == 400
